"""The training and evaluation commands: one start-up path for every way of running them.

``python train.py`` / ``python evaluate.py`` in a checkout and the installed
``transformer-mt-train`` / ``transformer-mt-evaluate`` (``[project.scripts]`` in
pyproject.toml) all call :func:`train` / :func:`evaluate`: the same Hydra configs, shipped
inside the package (``transformer_mt/configs``, a link to the repository's ``configs/`` that
the wheel turns into files), so they run from any directory. ``transformer-mt-translate`` and
``transformer-mt-export`` are argparse commands (``transformer_mt.inference``).

This is an entry point: it may import ``transformer_mt.training`` (only when the command
runs, so ``--help`` and config errors answer at once).
"""

from __future__ import annotations

import os

# OpenMP reads its wait policy once, when torch loads it: set it before anything imports
# torch. PASSIVE threads sleep between parallel regions instead of spinning; on a busy CPU a
# spinning thread burns the core its descheduled sibling needs (measured in
# docs/benchmarks/loop_threads.json). An OMP_WAIT_POLICY already in the environment wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig

from transformer_mt.data.config import register_stored_overrides
from transformer_mt.errors import guarded, run_entry_point

#: The Hydra config directory inside the installed package.
CONFIG_DIR = str(Path(__file__).resolve().parent / "configs")


def register_configs() -> None:
    """Put the configs written in code into Hydra's ConfigStore (idempotent).

    Called before composing: by the commands here, and by tests that compose the YAML.
    """
    from transformer_mt.training.config import register_schemas

    register_schemas()  # train.yaml's schema: types and keys checked at composition
    register_stored_overrides()  # configs/evaluate.yaml's `data: stored`


@guarded
def _train(cfg: DictConfig) -> float | None:
    from transformer_mt.training.run import run

    return run(cfg)


@guarded
def _evaluate(cfg: DictConfig) -> dict[str, Any] | None:
    from transformer_mt.inference.evaluate import run

    return run(cfg)


# Guarded inside the Hydra function, so that Hydra's handler never sees a user error.
@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="train")
def _train_main(cfg: DictConfig) -> float | None:
    return _train(cfg)


@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="evaluate")
def _evaluate_main(cfg: DictConfig) -> dict[str, Any] | None:
    return _evaluate(cfg)


def train() -> None:
    """``transformer-mt-train [experiment=...] [key=value ...]`` (as ``python train.py``)."""
    register_configs()
    run_entry_point(_train_main)


def evaluate() -> None:
    """``transformer-mt-evaluate ckpt_path=PATH [key=value ...]`` (as ``python evaluate.py``)."""
    register_configs()
    run_entry_point(_evaluate_main)
