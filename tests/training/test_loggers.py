"""Loggers: wandb stays offline without an API key; TensorBoard writes event files."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from transformer_mt.training.run import run

from conftest import FAST_TRAIN, compose_train


def test_wandb_offline_writes_files_without_network(tmp_path: Path, monkeypatch) -> None:
    pytest.importorskip("wandb")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    # Any attempt to reach a server would go to a closed local port and fail loudly.
    monkeypatch.setenv("WANDB_BASE_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    start = time.monotonic()
    cfg = compose_train(tmp_path, [*FAST_TRAIN, "logger=wandb", "test_after_fit=false"])
    run(cfg)
    assert time.monotonic() - start < 120  # no retry loop against an unreachable server
    assert os.environ["WANDB_MODE"] in (
        "offline",
        "dryrun",
    )  # WandbLogger(offline=True) says dryrun
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert runs, f"no offline run under {tmp_path / 'wandb'}"
    assert any(p.suffix == ".wandb" for p in runs[0].iterdir())


def test_tensorboard_writes_event_file(tmp_path: Path) -> None:
    cfg = compose_train(tmp_path, [*FAST_TRAIN, "logger=tensorboard", "test_after_fit=false"])
    run(cfg)
    assert list((tmp_path / "tensorboard").rglob("events.out.tfevents.*"))


def test_csv_logger_appends_to_an_earlier_part_and_widens_its_header(tmp_path: Path) -> None:
    import csv

    from transformer_mt.training.loggers import CSVLogger

    first = CSVLogger(tmp_path, name="csv", version="")
    first.log_metrics({"train/loss": 2.5}, step=0)
    first.log_metrics({"train/loss": 2.0, "val/loss": 1.5}, step=1)
    first.save()
    # A resumed part: a new logger on the same directory, which Lightning's would empty.
    second = CSVLogger(tmp_path, name="csv", version="")
    second.log_metrics({"train/loss": 1.0}, step=2)
    second.save()
    second.log_metrics({"train/loss": 0.5, "val/bleu": 12.0}, step=3)  # a new column
    second.save()
    with open(tmp_path / "csv" / "metrics.csv", newline="") as handle:
        reader = csv.DictReader(handle)
        rows = list(reader)
    assert reader.fieldnames == ["step", "train/loss", "val/bleu", "val/loss"]
    assert [(r["step"], r["train/loss"], r["val/loss"], r["val/bleu"]) for r in rows] == [
        ("0", "2.5", "", ""),
        ("1", "2.0", "1.5", ""),
        ("2", "1.0", "", ""),
        ("3", "0.5", "", "12.0"),
    ]
    assert [p.name for p in (tmp_path / "csv").iterdir()] == ["metrics.csv"]  # no temp left
