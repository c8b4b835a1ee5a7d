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

    if cfg.distill.teacher:
        distil_into(cfg)
    return run(cfg, metrics)


def distil_into(cfg: DictConfig) -> None:
    """``distill.teacher``: the teacher's translations of the training sources (decoded now,
    or kept from an earlier run with this teacher) become the run's training targets;
    ``distilled.json`` in the run directory names them and their teacher."""
    import dataclasses
    import json
    from pathlib import Path

    from transformer_mt.cli.options import load_translator
    from transformer_mt.data.sources import load_corpus
    from transformer_mt.files import write_text_atomic
    from transformer_mt.inference.distill import distil, file_digest
    from transformer_mt.training.config import train_settings

    settings = train_settings(cfg)
    distill, data = settings.distill, settings.data.config()
    for path in distill.teacher:
        if not Path(path).is_file():
            raise ValueError(f"distill.teacher: {path} is not a file; give the teacher's .ckpt")

    def open_teacher() -> Any:
        translator = load_translator(
            distill.teacher, engine=distill.engine, ct2_model=None,
            compute_type=distill.compute_type, device=None, tgt_lang=None,
            max_tokens=distill.max_tokens, max_sentences=None,
        )  # fmt: skip
        taught = translator.loaded.data_config()
        if taught is not None and (taught.src_lang, taught.tgt_lang) != (
            data.src_lang, data.tgt_lang,
        ):  # fmt: skip
            raise ValueError(
                f"distill.teacher translates {taught.src_lang}->{taught.tgt_lang}, this run "
                f"trains {data.src_lang}->{data.tgt_lang}; give a teacher of this direction"
            )
        translator.search = dataclasses.replace(translator.search, beam_size=distill.beam_size)
        return translator

    teacher = {
        "checkpoints": [
            {"path": str(Path(p).resolve()), "sha256": file_digest(p)} for p in distill.teacher
        ],
        "decoding": {
            "beam_size": distill.beam_size, "engine": distill.engine,
            "compute_type": distill.compute_type, "max_tokens": distill.max_tokens,
        },
        "direction": f"{data.src_lang}-{data.tgt_lang}",
    }  # fmt: skip
    sources = load_corpus(data)["train"]["src"]
    targets, made = distil(
        sources, teacher, open_teacher, distill.dir, shard_size=distill.shard_size
    )
    cfg.data.train_targets = str(targets)
    cfg.data.train_targets_mix = distill.mix_references
    record = {"targets": str(targets), **made}
    write_text_atomic(
        Path(settings.run_dir) / "distilled.json", json.dumps(record, indent=2) + "\n"
    )


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
