"""The installed commands (``[project.scripts]`` in pyproject.toml).

``transformer-mt-train`` and ``transformer-mt-evaluate`` are ``train.py`` and ``evaluate.py``
for an installed package: the same Hydra configs, shipped inside the package
(``transformer_mt/configs``, a link to the repository's ``configs/`` that the wheel turns into
files), so they run from any directory. ``transformer-mt-translate`` and
``transformer-mt-export`` are argparse commands (``transformer_mt.inference``).

This is an entry point: like ``train.py`` it may import ``transformer_mt.training`` (only when
the command runs, so ``--help`` and config errors answer at once).
"""

from __future__ import annotations

import os

# As in train.py: OpenMP reads its wait policy when torch loads, so set it before any import
# that may load torch; PASSIVE unless the environment says otherwise (README, Train).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig

from transformer_mt.cli import guarded, run_entry_point
from transformer_mt.data.config import register_stored_overrides

register_stored_overrides()  # configs/evaluate.yaml's `data: stored`

#: The Hydra config directory inside the installed package.
CONFIG_DIR = str(Path(__file__).resolve().parent / "configs")


@guarded
def _train(cfg: DictConfig) -> float | None:
    from transformer_mt.training.run import run

    return run(cfg)


@guarded
def _evaluate(cfg: DictConfig) -> dict[str, Any] | None:
    from transformer_mt.inference.evaluate import run

    return run(cfg)


@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="train")
def _train_main(cfg: DictConfig) -> float | None:
    return _train(cfg)


@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="evaluate")
def _evaluate_main(cfg: DictConfig) -> dict[str, Any] | None:
    return _evaluate(cfg)


def train() -> None:
    """``transformer-mt-train [experiment=...] [key=value ...]`` (as ``python train.py``)."""
    run_entry_point(_train_main)


def evaluate() -> None:
    """``transformer-mt-evaluate ckpt_path=PATH [key=value ...]`` (as ``python evaluate.py``)."""
    run_entry_point(_evaluate_main)
