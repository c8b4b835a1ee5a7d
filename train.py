"""Train a Transformer: `python train.py [experiment=multi30k_de_en] [key=value ...]`.

Thin entry point: Hydra composes configs/train.yaml, transformer_mt.training.run.run does the work,
transformer_mt.cli turns user mistakes into one `error: ...` line (docs/errors.md).
"""

import os

# OpenMP reads its wait policy once, when torch loads it: set it before anything imports
# torch. PASSIVE threads sleep between parallel regions instead of spinning. On a busy CPU a
# spinning thread burns the core its descheduled sibling needs (2-thread training was 3-10x
# slower so); on a quiet one spinning gains ~5% (docs/benchmarks/loop_threads.json). An
# OMP_WAIT_POLICY already in the environment wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

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
