"""One model for several directions: training, per-direction validation, the checkpoint."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from conftest import FILES_TRAIN, compose_train, write_multi_corpus

MULTI = [*FILES_TRAIN, "trainer.max_epochs=2", "data.max_len=32"]


@pytest.fixture(scope="module")
def multi_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from transformer_mt.training.run import run

    base = tmp_path_factory.mktemp("multi")
    corpus = write_multi_corpus(base / "corpus")
    run_dir = base / "run"
    run(compose_train(run_dir, [*MULTI, f"data.dir={corpus}", "data.directions=[en-de,en-fr]"]))
    return run_dir


def test_validation_scores_each_direction_and_their_mean(multi_run: Path) -> None:
    with open(next(multi_run.rglob("metrics.csv")), newline="") as f:
        rows = [r for r in csv.DictReader(f) if r.get("val/bleu")]
    assert len(rows) == 2
    for row in rows:
        per = [float(row[f"val/bleu/{d}"]) for d in ("en-de", "en-fr")]
        assert float(row["val/bleu"]) == pytest.approx(sum(per) / 2, abs=1e-4)
        assert row["val/chrf/en-de"] and row["val/bleu_tok/en-fr"]
    with open(next(multi_run.rglob("metrics.csv")), newline="") as f:
        test_rows = [r for r in csv.DictReader(f) if r.get("test/bleu")]
    assert test_rows and test_rows[0]["test/bleu/en-fr"]


def test_the_checkpoint_knows_its_directions_and_tags(multi_run: Path) -> None:
    from transformer_mt.checkpoint import load_model

    loaded = load_model(multi_run / "checkpoints" / "last.ckpt")
    assert loaded.data["directions"] == ["en-de", "en-fr"]
    assert loaded.tokenizer.target_languages == ["de", "fr"]
    assert (loaded.src_lang, loaded.tgt_lang) == ("en", "mul")
