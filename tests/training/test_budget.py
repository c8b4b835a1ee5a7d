"""A wall-clock budget is the lr horizon: the run anneals whenever the budget ends.

The clock is virtual (:class:`VirtualClockBudget` advances a fixed number of seconds per
training step), so what these tests check never depends on how fast the machine is: a
"slow machine" is a run whose steps cost more virtual seconds.
"""

from __future__ import annotations

import csv
import dataclasses
import inspect
import itertools
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch

from transformer_mt.errors import UserError
from transformer_mt.training.budget import (
    BudgetProgressBar,
    TrainingBudget,
    time_left,
    validation_interval,
)
from transformer_mt.training.config import BudgetSettings
from transformer_mt.training.run import run
from transformer_mt.training.schedules import lr_factor

from conftest import FAST_TRAIN, clock_of_batches, compose_train


class VirtualClockBudget(TrainingBudget):
    """:class:`TrainingBudget` on a clock that advances ``step_seconds`` per training step.

    Validation costs ``validation_seconds``. Lightning's own Timer still runs on the real
    clock, with a budget far above what a test run takes, so it never decides anything.
    """

    def __init__(self, step_seconds: float, validation_seconds: float = 0.0) -> None:
        super().__init__()
        self.step_seconds = step_seconds
        self.validation_seconds = validation_seconds
        self.clock = 0.0

    def now(self) -> float:
        return self.clock

    def on_train_batch_end(self, trainer: Any, pl_module: Any, *args: Any, **kwargs: Any) -> None:
        self.clock += self.step_seconds
        super().on_train_batch_end(trainer, pl_module, *args, **kwargs)

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        self.clock += self.validation_seconds
        super().on_validation_end(trainer, pl_module)


def test_time_progress_drives_the_decay_after_the_warmup() -> None:
    warmup = 10
    assert lr_factor(5, warmup, "linear", None, time_progress=0.0) == pytest.approx(0.5)
    assert lr_factor(11, warmup, "linear", None, time_progress=0.25) == pytest.approx(0.75)
    assert lr_factor(11, warmup, "linear", None, time_progress=1.0) == 0.0
    assert lr_factor(11, warmup, "cosine", None, time_progress=0.5) == pytest.approx(0.5)
    # With a step budget as well, whichever budget is further used up wins.
    assert lr_factor(60, warmup, "linear", 110, time_progress=0.1) == pytest.approx(1 - 50 / 101)
    assert lr_factor(20, warmup, "linear", 110, time_progress=0.9) == pytest.approx(0.1)


def test_a_decaying_schedule_accepts_a_time_budget_alone() -> None:
    with pytest.raises(ValueError, match=r"set trainer\.max_time"):
        lr_factor(1, 10, "linear", None)
    assert lr_factor(1, 10, "linear", None, time_progress=0.0) == pytest.approx(0.1)


def test_progress_counts_from_the_end_of_the_warmup_and_reserves_the_last_validation() -> None:
    budget = VirtualClockBudget(step_seconds=1.0)
    budget.initial_reserve = 0.0  # this test is about the measured reserve
    budget.seconds = 100.0
    budget._started = 0.0
    budget.clock = 7.0
    assert budget.progress(step=3, warmup_steps=5) == 0.0  # still warming up
    assert budget.progress(step=6, warmup_steps=5) == 0.0  # warmup ended at 7 s
    assert budget.warmup_end == 7.0
    budget.clock = 53.5
    assert budget.progress(step=40, warmup_steps=5) == pytest.approx(46.5 / 93.0)
    budget.last_validation = 10.0  # the horizon moves so the final validation fits
    assert budget.horizon() == 90.0
    assert budget.progress(step=40, warmup_steps=5) == pytest.approx(46.5 / 83.0)
    budget.clock = 95.0
    assert budget.progress(step=80, warmup_steps=5) == 1.0


def test_the_final_validation_is_reserved_before_any_validation_was_timed() -> None:
    budget = TrainingBudget(initial_reserve=0.05)
    budget.seconds = 240.0
    assert budget.horizon() == pytest.approx(228.0)  # 5% kept from the start
    budget.last_validation = 3.0  # then what a validation really takes
    assert budget.horizon() == pytest.approx(237.0)
    assert TrainingBudget(reserve_validation=False).horizon() is None  # no budget, no horizon


def test_a_warmup_longer_than_the_budget_ends_at_its_fraction_of_the_time() -> None:
    budget = VirtualClockBudget(step_seconds=1.0)
    budget.max_warmup_fraction, budget.initial_reserve = 0.1, 0.0
    budget.seconds = 100.0
    budget._started = 0.0
    budget.clock = 5.0
    assert budget.warmup_progress(step=5, warmup_steps=200) == pytest.approx(0.5)  # by time
    assert budget.progress(step=5, warmup_steps=200) == 0.0
    budget.clock = 10.0  # 10% of the budget: the warmup is over at step 10 of 200
    assert budget.warmup_progress(step=10, warmup_steps=200) == 1.0
    assert budget.warmup_end == 10.0
    budget.clock = 55.0
    assert budget.progress(step=55, warmup_steps=200) == pytest.approx(45.0 / 90.0)
    factor = lr_factor(55, 200, "linear", None, 0.5, warmup_progress=1.0)
    assert factor == pytest.approx(0.5)  # decaying, not still warming up at 55/200
    assert lr_factor(5, 200, "linear", None, 0.0, warmup_progress=0.5) == pytest.approx(0.5)


def test_a_step_budget_caps_the_warmup_at_its_fraction() -> None:
    budget = TrainingBudget(max_warmup_fraction=0.1)
    assert budget.capped_warmup(400, 600) == 60
    assert budget.capped_warmup(40, 600) == 40  # a short warmup is kept
    assert budget.capped_warmup(400, None) == 400  # no step horizon (inverse_sqrt)
    assert budget.capped_warmup(400, 5) == 1
    with pytest.raises(ValueError, match=r"budget\.max_warmup_fraction must be in \[0, 1\)"):
        TrainingBudget(max_warmup_fraction=1.5)


def test_budget_state_survives_a_checkpoint() -> None:
    budget = VirtualClockBudget(step_seconds=1.0)
    budget._started = 0.0
    budget.clock = 30.0
    budget.warmup_end, budget.last_validation = 12.0, 4.0
    restored = VirtualClockBudget(step_seconds=1.0)
    restored.load_state_dict(budget.state_dict())
    assert (restored.elapsed(), restored.warmup_end, restored.last_validation) == (30.0, 12.0, 4.0)


def test_a_resume_with_the_budget_used_up_says_so(caplog: pytest.LogCaptureFixture) -> None:
    budget = VirtualClockBudget(step_seconds=1.0)
    budget.seconds, budget.elapsed_before = 60.0, 61.5
    with caplog.at_level("WARNING", logger="transformer_mt.training.budget"):
        budget.on_train_start(None, None)  # type: ignore[arg-type]
    assert caplog.messages[-1] == (
        "the wall-clock budget trainer.max_time (60 s) was used up by the earlier part(s) of "
        "this run (62 s): training stops at once; to train on, resume with a larger "
        "trainer.max_time"
    )
    caplog.clear()
    budget.elapsed_before = 10.0
    with caplog.at_level("WARNING", logger="transformer_mt.training.budget"):
        budget.on_train_start(None, None)  # type: ignore[arg-type]
    assert not caplog.messages


def _budget_run(
    tmp_path: Path, step_seconds: float, warmup_steps: int = 5
) -> tuple[dict[str, Any], list[float]]:
    cfg = compose_train(
        tmp_path,
        [
            *FAST_TRAIN,
            "trainer.max_epochs=null",
            "trainer.max_time=00:02:00:00",  # the budget: 7,200 virtual seconds
            "trainer.log_every_n_steps=1",
            "module.lr_schedule=linear",
            f"module.warmup_steps={warmup_steps}",
            "optimizer.lr=1e-3",
            "+callbacks.budget._target_=test_budget.VirtualClockBudget",
            f"+callbacks.budget.step_seconds={step_seconds}",
            "+callbacks.budget.validation_seconds=100",
        ],
    )
    run(cfg)
    rows = list(csv.DictReader((tmp_path / "csv" / "metrics.csv").open()))
    lrs = [float(r["train/lr"]) for r in rows if r.get("train/lr")]
    last = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=True)
    return last, lrs


@pytest.mark.parametrize("step_seconds", [60.0, 120.0])  # a fast and a 2x slower machine
def test_a_time_budget_ends_annealed_and_tested_on_any_machine(
    tmp_path: Path, step_seconds: float
) -> None:
    last, lrs = _budget_run(tmp_path, step_seconds)
    steps = last["global_step"]
    # The whole budget was used, less the reserve for the final validation: 7,200 s of steps
    # minus validations (100 s each, one per epoch of ~10 steps) minus the last one's reserve.
    assert 7200 * 0.75 <= steps * step_seconds <= 7200
    assert max(lrs) == pytest.approx(1e-3)  # the peak after the warmup
    assert lrs[-1] < 0.05 * 1e-3  # annealed: the last steps ran at ~0
    decay = lrs[lrs.index(max(lrs)) :]
    assert all(a >= b for a, b in itertools.pairwise(decay))  # monotone after the warmup
    # Training stopped on the budget (there is no epoch limit) and the run was tested.
    state = last["callbacks"]
    budget_state = next(v for k, v in state.items() if "VirtualClockBudget" in k)
    assert budget_state["elapsed"] == pytest.approx(
        steps * step_seconds + 100 * (last["epoch"] + 1), abs=101
    )
    metrics = (tmp_path / "csv" / "metrics.csv").read_text()
    assert "test/bleu" in metrics


@pytest.mark.parametrize("preset", ["multi30k_de_en", "multi30k_en_de"])
def test_multi30k_presets_state_their_budget_in_wall_clock(tmp_path: Path, preset: str) -> None:
    cfg = compose_train(tmp_path, [f"experiment={preset}"])
    assert cfg.trainer.max_time == "00:01:00:00"
    assert cfg.trainer.max_epochs is None and cfg.trainer.max_steps == -1  # no epoch horizon
    assert cfg.module.lr_schedule == "linear"


def test_a_budget_shorter_than_the_warmup_still_peaks_and_anneals(tmp_path: Path) -> None:
    """warmup_steps=1000 in a budget of ~110 steps: the warmup ends at 10% of the time."""
    last, lrs = _budget_run(tmp_path, step_seconds=60.0, warmup_steps=1000)
    peak = lrs.index(max(lrs))
    assert max(lrs) == pytest.approx(1e-3)  # the peak is reached, not 1e-3 * 110/1000
    # The warmup ends by 10% of the budget's time (720 s): within the first 12 steps of 60 s
    # (validations take clock time too), where warmup_steps alone would rise for 1,000 steps.
    assert 1 <= peak <= 12
    assert all(a < b for a, b in itertools.pairwise(lrs[: peak + 1]))
    assert lrs[-1] < 0.05 * 1e-3
    assert all(a >= b for a, b in itertools.pairwise(lrs[peak:]))
    assert last["global_step"] < 1000


def test_progress_bar_shows_the_time_left_and_no_fake_epoch_count() -> None:
    budget = VirtualClockBudget(step_seconds=1.0)
    assert time_left(budget) is None  # no trainer.max_time: nothing to count down
    budget.seconds, budget.last_validation = 600.0, 30.0
    budget._started, budget.clock = 0.0, 125.0
    assert time_left(budget) == "7:25"  # 600 - 30 kept for the last validation - 125 used
    budget.clock = 900.0
    assert time_left(budget) == "0:00"

    class Trainer:
        max_epochs = -1  # what Lightning sets when only max_time bounds the run

    bar = BudgetProgressBar()
    bar._trainer = Trainer()
    assert bar._get_train_description(20).strip() == "Epoch 20"
    Trainer.max_epochs = 3
    assert bar._get_train_description(1).strip() == "Epoch 1/2"


def test_a_step_budget_ending_mid_epoch_validates_its_last_steps(tmp_path: Path) -> None:
    max_steps = 15
    overrides = [*FAST_TRAIN, "trainer.max_epochs=null", f"trainer.max_steps={max_steps}"]
    run(compose_train(tmp_path, [*overrides, "test_after_fit=false"]))
    last = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=True)
    batches = last["loops"]["fit_loop"]["epoch_loop.batch_progress"]
    assert not batches["is_last_batch"], "the budget must end part-way through an epoch"
    assert last["global_step"] == max_steps
    rows = list(csv.DictReader((tmp_path / "csv" / "metrics.csv").open()))
    # Lightning logs a validation at the index of the step before it (epoch ends alike).
    assert [int(r["step"]) + 1 for r in rows if r.get("val/bleu")] == [max_steps]
    assert list((tmp_path / "checkpoints").glob(f"best-*-step{max_steps:06d}-*.ckpt"))


def test_validations_divide_the_budget_in_any_form_lightning_takes() -> None:
    assert validation_interval("00:01:00:00", 10) == timedelta(minutes=6)
    assert validation_interval({"minutes": 30}, 10) == timedelta(minutes=3)
    assert validation_interval(timedelta(hours=2), 8) == timedelta(minutes=15)


@pytest.mark.parametrize(
    ("max_time", "says"), [(None, "trainer.max_time is not set"), ("an hour", "DD:HH:MM:SS")]
)
def test_validations_need_a_wall_clock_budget(max_time: Any, says: str) -> None:
    with pytest.raises(UserError, match=says):
        validation_interval(max_time, 10)


def test_the_budget_settings_are_the_callbacks_options_with_its_defaults() -> None:
    options = inspect.signature(TrainingBudget).parameters
    settings = dataclasses.fields(BudgetSettings)
    assert {f.name: f.default for f in settings} == {k: v.default for k, v in options.items()}


def test_a_negative_number_of_validations_is_refused() -> None:
    with pytest.raises(ValueError, match=r"budget\.validations"):
        TrainingBudget(validations=-1)


def test_validations_fall_at_fixed_fractions_of_a_time_budget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``budget.validations=10`` over 10 hours validates every hour, not every epoch.

    Lightning's clock is replaced by 10 minutes per training batch (so every 6 batches is an
    hour) and the run stops on a step budget: nothing waits on time, and the real 10 hours
    never end.
    """
    clock_of_batches(monkeypatch, seconds_per_batch=600.0)
    settings = [*FAST_TRAIN, "trainer.max_epochs=null", "trainer.max_steps=30"]
    budget = ["trainer.max_time=00:10:00:00", "budget.validations=10", "test_after_fit=false"]
    run(compose_train(tmp_path, [*settings, *budget]))
    rows = list(csv.DictReader((tmp_path / "csv" / "metrics.csv").open()))
    # Lightning logs a validation at the index of the step before it; the last is the end's.
    assert [int(r["step"]) + 1 for r in rows if r.get("val/bleu")] == [6, 12, 18, 24, 30]
