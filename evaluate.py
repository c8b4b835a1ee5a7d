"""Evaluate a checkpoint: `python evaluate.py ckpt_path=PATH [key=value ...]`.

Thin entry point: Hydra composes configs/evaluate.yaml, transformer_mt.evaluate does the work.
User errors print one line and exit 1 (HYDRA_FULL_ERROR=1 shows the traceback).
"""

from typing import Any

import hydra
from omegaconf import DictConfig

from transformer_mt.evaluate import main as evaluate_main


@hydra.main(version_base="1.3", config_path="configs", config_name="evaluate")
def main(cfg: DictConfig) -> dict[str, Any] | None:
    return evaluate_main(cfg)


if __name__ == "__main__":
    main()
