"""``transformer-mt-evaluate ckpt_path=PATH [key=value ...]`` (as ``python evaluate.py``).

Hydra composes ``configs/evaluate.yaml`` against its schema
(:class:`~transformer_mt.inference.settings.EvalSchema`), the command turns it into typed
settings once and :func:`transformer_mt.inference.evaluate.run` does the work; a CTranslate2
engine without ``engine_model=`` gets the export wing's converter.
"""

from __future__ import annotations

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


@spelled(
    {
        **search_keys("decoding"),
        "max_tokens": "batch.max_tokens",
        "max_sentences": "batch.sentences",
    }
)
def evaluate(cfg: DictConfig) -> dict[str, Any]:
    """Evaluate as the composed ``cfg`` says: typed once, then the pipeline (also for the
    Python API, tests and scripts that compose the config themselves); a setting's error
    spells its fix as an override."""
    from transformer_mt.cli.options import converter
    from transformer_mt.inference.evaluate import run
    from transformer_mt.inference.settings import eval_settings

    settings = eval_settings(cfg)
    return run(settings, convert=converter(settings.engine, settings.engine_model))


@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="evaluate")
@task
def _main(cfg: DictConfig) -> Any:
    return evaluate(cfg)


def main() -> None:
    """The command: register the schemas, then let Hydra compose and run."""
    register_configs()
    run_entry_point(_main)


if __name__ == "__main__":
    main()
