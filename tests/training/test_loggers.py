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
