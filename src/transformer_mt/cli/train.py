"""``transformer-mt-train [experiment=...] [key=value ...]`` (as ``python train.py``).

Hydra composes ``configs/train.yaml`` against its schema and
:func:`transformer_mt.training.run.run` does the work; a user mistake is one ``error:`` line
and exit status 2 (docs/errors.md).
"""

from __future__ import annotations

import logging
from typing import Any

import hydra
from omegaconf import DictConfig

from transformer_mt.cli.hydra_app import (
    CONFIG_DIR,
    register_configs,
    run_entry_point,
    search_keys,
    spelled,
    task,
)


@spelled(search_keys("module.decoding"))
def train(cfg: DictConfig, metrics: dict[str, float] | None = None) -> Any:
    """Train as the composed ``cfg`` says (also for the Python API); its ``optimized_metric``,
    and its validation and test metrics put into ``metrics``. A setting's error spells its fix
    as an override."""
    # torch's import of sympy loads matplotlib, whose first start on a machine logs the font
    # cache it built: a line about nothing this run does.
    logging.getLogger("matplotlib").setLevel(logging.WARNING)
    # Imported when the command runs, so that --help and config errors answer at once.
    from transformer_mt.training.run import run

    return run(cfg, metrics)


# Guarded inside the Hydra function, so that Hydra's handler never sees a user error.
@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="train")
@task
def _main(cfg: DictConfig) -> Any:
    return train(cfg)


def main() -> None:
    """The command: register the schemas, then let Hydra compose and run."""
    register_configs()
    run_entry_point(_main)


if __name__ == "__main__":
    main()
