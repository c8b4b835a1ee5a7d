"""Train a Transformer: `python train.py [experiment=multi30k_de_en] [key=value ...]`.

Thin entry point: Hydra composes configs/train.yaml, transformer_mt.training.run.run does the work,
transformer_mt.cli turns user mistakes into one `error: ...` line (docs/errors.md).
"""

import hydra
from omegaconf import DictConfig

from transformer_mt.cli import guarded, run_entry_point


@guarded
def train(cfg: DictConfig) -> float | None:
    """Import Lightning only now, so --help and config typos answer at once."""
    from transformer_mt.training.run import run

    return run(cfg)


@hydra.main(version_base="1.3", config_path="configs", config_name="train")
def main(cfg: DictConfig) -> float | None:
    # Guarded inside the Hydra function, so that Hydra's handler never sees a user error.
    return train(cfg)


if __name__ == "__main__":
    run_entry_point(main)
