"""Evaluate a checkpoint: `python evaluate.py ckpt_path=PATH [key=value ...]`.

Thin entry point: Hydra composes configs/evaluate.yaml, transformer_mt.inference.evaluate does the work,
transformer_mt.cli turns user mistakes into one `error: ...` line and exit status 2
(TRANSFORMER_MT_DEBUG=1 or HYDRA_FULL_ERROR=1 shows the traceback; docs/errors.md).
"""

from typing import Any

import hydra
from omegaconf import DictConfig

from transformer_mt.cli import guarded, run_entry_point
from transformer_mt.data.config import register_stored_overrides

register_stored_overrides()  # configs/evaluate.yaml's `data: stored`


@guarded
def evaluate(cfg: DictConfig) -> dict[str, Any] | None:
    """Import torch and the data libraries only now, so --help and config typos answer at once."""
    from transformer_mt.inference.evaluate import run

    return run(cfg)


@hydra.main(version_base="1.3", config_path="configs", config_name="evaluate")
def main(cfg: DictConfig) -> dict[str, Any] | None:
    return evaluate(cfg)


if __name__ == "__main__":
    run_entry_point(main)
