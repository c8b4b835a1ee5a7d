"""Sentence length limits: what is too long is dropped or truncated and counted, never fatal,
and the shipped configs leave room for <bos>/<eos> in the positional table."""

from __future__ import annotations

from pathlib import Path

import pytest

from transformer_mt.training.run import run

from conftest import CONFIGS, FILES_TRAIN, compose_train, write_corpus


def test_some_pairs_too_long_are_dropped_and_counted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    import hydra

    long = " ".join(["word"] * 200)
    corpus = write_corpus(tmp_path / "corpus")
    with open(corpus / "train.en", "a") as handle:
        handle.write(long + "\n")
    with open(corpus / "train.de", "a") as handle:
        handle.write("kurz\n")
    cfg = compose_train(tmp_path / "run", [*FILES_TRAIN, f"data.dir={corpus}"])
    from transformer_mt.data.datamodule import TranslationDataModule

    dm = TranslationDataModule(hydra.utils.instantiate(cfg.data), work_dir=tmp_path / "run")
    with caplog.at_level("WARNING"):
        dm.prepare_data()
        dm.setup("fit")
    assert len(dm.splits["train"]) == 30
    assert any("Dropped 1 of 31 training pairs" in r.getMessage() for r in caplog.records)


def test_shipped_data_and_model_configs_fit_the_positional_table(tmp_path: Path) -> None:
    """Under the defaults a sentence of data.max_len tokens + <bos>/<eos> fits model.max_len."""
    from transformer_mt.training.checks import check_max_len

    for data in sorted(p.stem for p in (CONFIGS / "data").glob("*.yaml")):
        for model in sorted(p.stem for p in (CONFIGS / "model").glob("*.yaml")):
            cfg = compose_train(tmp_path, [f"data={data}", f"model={model}"])
            check_max_len(cfg.data.max_len, cfg.model.max_len)  # raises if it does not fit
    for experiment in sorted(p.stem for p in (CONFIGS / "experiment").glob("*.yaml")):
        cfg = compose_train(tmp_path, [f"experiment={experiment}"])
        check_max_len(cfg.data.max_len, cfg.model.max_len)


def test_over_long_validation_sentence_is_truncated_not_fatal(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A 200-word validation line under limits that fit: validated, counted, no crash."""
    corpus = write_corpus(tmp_path / "corpus")
    for lang in ("en", "de"):
        with open(corpus / f"val.{lang}", "a") as handle:
            handle.write(" ".join(["wort"] * 200) + "\n")
    cfg = compose_train(
        tmp_path / "run",
        [*FILES_TRAIN, f"data.dir={corpus}", "data.max_len=63", "model.max_len=64"],
    )
    with caplog.at_level("WARNING"):
        run(cfg)
    assert any("truncated" in r.getMessage() for r in caplog.records)
    assert (tmp_path / "run" / "checkpoints" / "last.ckpt").is_file()
