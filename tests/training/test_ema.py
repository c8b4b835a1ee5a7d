"""Weight EMA (``callbacks=ema``): validation, test and checkpoints use the average; resume exact.

A tiny run with a fast-moving average (decay 0.8) over two epochs of the numbers data. Its
checkpoints hold the average as ``state_dict`` (what evaluate.py, translate and export read) and
the raw weights as ``current_model_state``; the validation loss logged during training is that
of the average, and so is the test after training; a run resumed from a mid-epoch checkpoint
ends with the same average and raw weights as the uninterrupted one.
"""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import torch

from transformer_mt.checkpoint import load_checkpoint
from transformer_mt.training.run import prepare_and_build, run

from conftest import FAST_TRAIN, best_checkpoint, compose_train

EMA = "callbacks.ema={_target_:transformer_mt.training.callbacks.WeightEMA,decay:0.8}"
EMA_RUN = [
    *FAST_TRAIN,
    EMA,
    "trainer.max_epochs=2",
    "trainer.log_every_n_steps=1",
    "module.warmup_steps=10",
    "model.dropout=0.1",  # the random stream must continue exactly on resume
    "callbacks.recent_checkpoints.every_n_train_steps=5",
    "callbacks.recent_checkpoints.save_top_k=-1",
]


@pytest.fixture(scope="module")
def ema_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """train.py's pipeline with EMA on: fit, then the test of the best checkpoint."""
    run_dir = tmp_path_factory.mktemp("ema_run")
    run(compose_train(run_dir, EMA_RUN))
    return run_dir


def last_logged(run_dir: Path, name: str) -> float:
    with open(run_dir / "csv" / "metrics.csv", newline="") as f:
        values = [row[name] for row in csv.DictReader(f) if row.get(name)]
    return float(values[-1])


def test_checkpoints_hold_the_average_and_the_raw_weights(ema_run: Path) -> None:
    last = load_checkpoint(ema_run / "checkpoints" / "last.ckpt")
    average, raw = last["state_dict"], last["current_model_state"]
    assert average.keys() == raw.keys()
    assert not torch.equal(average["model.generator.weight"], raw["model.generator.weight"])


def test_validation_and_test_score_the_average(ema_run: Path, tmp_path: Path) -> None:
    """What the run logged is what a fresh trainer measures on the checkpoints' state_dict."""
    cfg = compose_train(tmp_path, [*EMA_RUN, "callbacks.ema=null"])
    datamodule, module, trainer = prepare_and_build(cfg)
    last = ema_run / "checkpoints" / "last.ckpt"
    (val,) = trainer.validate(module, datamodule=datamodule, ckpt_path=last, verbose=False)
    assert val["val/loss"] == pytest.approx(last_logged(ema_run, "val/loss"), rel=1e-6)
    (test,) = trainer.test(
        module, datamodule=datamodule, ckpt_path=best_checkpoint(ema_run), verbose=False
    )
    assert test["test/loss"] == pytest.approx(last_logged(ema_run, "test/loss"), rel=1e-6)
    module.load_state_dict(load_checkpoint(last)["current_model_state"])
    (raw,) = trainer.validate(module, datamodule=datamodule, verbose=False)
    assert raw["val/loss"] != pytest.approx(val["val/loss"], rel=1e-4)  # the check can tell


@pytest.mark.slow
def test_resume_with_ema_is_exact(ema_run: Path, tmp_path: Path) -> None:
    (ckpt,) = (ema_run / "checkpoints").glob("recent-*-step000010.ckpt")
    resumed = tmp_path / "resumed"
    run(compose_train(resumed, [*EMA_RUN, "test_after_fit=false", f"ckpt_path={ckpt}"]))
    want = load_checkpoint(ema_run / "checkpoints" / "last.ckpt")
    got = load_checkpoint(resumed / "checkpoints" / "last.ckpt")
    assert got["global_step"] == want["global_step"]
    for key in ("state_dict", "current_model_state", "averaging_state"):
        assert got[key].keys() == want[key].keys()
        for name, value in want[key].items():
            torch.testing.assert_close(got[key][name], value, rtol=0, atol=0, msg=name)
