"""Train a Transformer: `python train.py [experiment=multi30k_de_en] [key=value ...]`.

Thin entry point: Hydra composes configs/train.yaml, transformer_mt.train.run does the work.
"""

import hydra
from omegaconf import DictConfig

from transformer_mt.train import run


@hydra.main(version_base="1.3", config_path="configs", config_name="train")
def main(cfg: DictConfig) -> float | None:
    return run(cfg)


if __name__ == "__main__":
    main()
