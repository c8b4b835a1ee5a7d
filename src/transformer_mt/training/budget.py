"""A wall-clock budget the learning rate can see: ``trainer.max_time`` as the schedule's horizon.

A decay over a fixed number of epochs only anneals on the machine it was tuned on.
:class:`TrainingBudget` makes the budget the decay's horizon, so the learning rate reaches zero
when the budget ends on any machine:

- it measures the run's training time (validation included, as Lightning's ``Timer`` does)
  and keeps it in checkpoints, so the count continues on resume;
- ``linear``/``cosine`` decay by the fraction of the budget used since the warmup ended;
- the warmup ends after ``warmup_steps`` or ``max_warmup_fraction`` of the budget, whichever
  comes first, so a short sweep trial still reaches its peak and decays;
- it stops early enough for the last validation to finish inside the budget, reserving
  ``initial_reserve`` until a validation is timed, then the latest validation's duration;
- ``validations=N`` spreads N validations evenly over the budget, so ``average_last`` spans
  the same stretch of the decay whatever the budget (docs/training.md).

Without ``trainer.max_time`` the clock does nothing: step and epoch budgets are exact. A step
budget still ends as an early stop, so Lightning validates the last steps when
``trainer.max_steps`` falls part-way through an epoch.
"""

from __future__ import annotations

import logging
import time
from datetime import timedelta
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback, RichProgressBar, Timer
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities.exceptions import MisconfigurationException

from transformer_mt.errors import UserError

log = logging.getLogger(__name__)


class TrainingBudget(Callback):
    """Measures the run's use of ``trainer.max_time``; the lr schedule and the stop read it.

    Lightning's ``Timer`` still stops the run at ``max_time`` as a backstop; this callback
    stops it a validation earlier.

    Args:
        reserve_validation: stop when the time left is less than the latest validation took.
        max_warmup_fraction: the warmup ends at this fraction of the budget at the latest
            (seconds for ``trainer.max_time``, steps for a step or epoch budget).
        initial_reserve: fraction of a wall-clock budget kept for the final validation until
            a validation has been timed.
        validations: validate this many times, evenly in time, over a wall-clock budget;
            0 = the trainer's own ``val_check_interval``.
    """

    def __init__(
        self,
        reserve_validation: bool = True,
        *,
        max_warmup_fraction: float = 0.1,
        initial_reserve: float = 0.05,
        validations: int = 0,
    ) -> None:
        for name, value in (
            ("max_warmup_fraction", max_warmup_fraction),
            ("initial_reserve", initial_reserve),
        ):
            if not 0.0 <= value < 1.0:
                raise ValueError(f"budget.{name} must be in [0, 1), got {value}")
        if isinstance(validations, bool) or not isinstance(validations, int) or validations < 0:
            raise ValueError(f"budget.validations must be a whole number >= 0, got {validations}")
        self.validations = validations
        self.reserve_validation = reserve_validation
        self.max_warmup_fraction = max_warmup_fraction
        self.initial_reserve = initial_reserve
        self.seconds: float | None = None  # the budget; None = no wall-clock budget
        self.elapsed_before = 0.0  # training seconds of earlier parts of a resumed run
        self.warmup_end: float | None = None  # training seconds when the warmup ended
        self.last_validation = 0.0  # seconds the latest validation took
        self._started: float | None = None
        self._validation_started: float | None = None
        self._stopped = False

    # ------------------------------------------------------------------ clock

    def now(self) -> float:
        """Monotonic seconds; tests override it with a virtual clock."""
        return time.monotonic()

    def elapsed(self) -> float:
        """Training seconds used so far (earlier parts of a resumed run included)."""
        if self._started is None:
            return self.elapsed_before
        return self.elapsed_before + self.now() - self._started

    def horizon(self) -> float | None:
        """Seconds at which the decay reaches zero: the budget less the validation reserve."""
        if self.seconds is None:
            return None
        reserve = 0.0
        if self.reserve_validation:
            timed = self.last_validation > 0.0
            reserve = self.last_validation if timed else self.initial_reserve * self.seconds
        return max(self.seconds - reserve, 0.0)

    def capped_warmup(self, warmup_steps: int, total_steps: int | None) -> int:
        """``warmup_steps``, at most ``max_warmup_fraction`` of a step budget (and at least 1)."""
        if total_steps is None or self.max_warmup_fraction <= 0.0:
            return warmup_steps
        return max(min(warmup_steps, int(self.max_warmup_fraction * total_steps)), 1)

    def warmup_progress(self, step: int, warmup_steps: int) -> float:
        """Fraction of the warmup done at ``step`` (from 1); 1.0 once the warmup is over.

        With a wall-clock budget, whichever of steps and time is further; the first call past
        the warmup records when it ended, so the decay spans exactly the time left.
        """
        by_steps = min(step / max(warmup_steps, 1), 1.0)
        horizon = self.horizon()
        if self.warmup_end is not None or horizon is None:
            return 1.0 if self.warmup_end is not None else by_steps
        now = self.elapsed()
        cap = self.max_warmup_fraction * horizon
        by_time = now / cap if cap > 0.0 else 0.0
        if step > warmup_steps or by_time >= 1.0:
            self.warmup_end = now
            return 1.0
        return min(max(by_steps, by_time), 1.0)

    def progress(self, step: int, warmup_steps: int) -> float | None:
        """Fraction of the budget used since the warmup ended (0 during warmup); None: no budget."""
        horizon = self.horizon()
        if horizon is None:
            return None
        self.warmup_progress(step, warmup_steps)  # records the end of the warmup
        if self.warmup_end is None:
            return 0.0
        now = self.elapsed()
        span = horizon - self.warmup_end
        if span <= 0.0:
            return 1.0
        return min(max((now - self.warmup_end) / span, 0.0), 1.0)

    # ------------------------------------------------------------------ Lightning hooks

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        timer = next((cb for cb in trainer.callbacks if isinstance(cb, Timer)), None)
        if timer is None or timer.time_remaining() is None:
            self.seconds = None
            return
        # Timer counts from its own (restored) offset; its budget is elapsed + remaining.
        self.seconds = float(timer.time_elapsed() + (timer.time_remaining() or 0.0))

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._started = self.now()
        if self.seconds is not None:
            log.info(
                "wall-clock budget: %.0f s (%.0f s used before this start); the learning rate "
                "decays to zero by its end",
                self.seconds,
                self.elapsed_before,
            )
            if self.elapsed_before >= self.seconds:  # a resume would otherwise end silently
                log.warning(
                    "the wall-clock budget trainer.max_time (%.0f s) was used up by the earlier "
                    "part(s) of this run (%.0f s): training stops at once; to train on, resume "
                    "with a larger trainer.max_time",
                    self.seconds,
                    self.elapsed_before,
                )

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.elapsed_before = self.elapsed()
        self._started = None

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.state.fn == TrainerFn.FITTING and not trainer.sanity_checking:
            self._validation_started = self.now()

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._validation_started is not None:
            self.last_validation = self.now() - self._validation_started
            self._validation_started = None

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args: Any, **kwargs: Any
    ) -> None:
        max_steps = trainer.max_steps
        if max_steps not in (None, -1) and trainer.global_step >= max_steps:
            if not trainer.should_stop:
                trainer.should_stop = True
                log.info("step budget reached at step %d: a last validation follows", max_steps)
            return
        horizon = self.horizon()
        if horizon is None or self._stopped:
            return
        if self.elapsed() >= horizon:
            self._stopped = True
            trainer.should_stop = True
            log.info(
                "wall-clock budget reached after %.0f s at step %d (%.0f s kept for the final "
                "validation)",
                self.elapsed(),
                trainer.global_step,
                self.seconds - horizon if self.seconds is not None else 0.0,
            )

    # ------------------------------------------------------------------ checkpoints

    def state_dict(self) -> dict[str, Any]:
        return {
            "elapsed": self.elapsed(),
            "warmup_end": self.warmup_end,
            "last_validation": self.last_validation,
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.elapsed_before = float(state_dict.get("elapsed", 0.0))
        warmup_end = state_dict.get("warmup_end")
        self.warmup_end = None if warmup_end is None else float(warmup_end)
        self.last_validation = float(state_dict.get("last_validation", 0.0))


def validation_interval(max_time: Any, validations: int) -> timedelta:
    """The time between validations for ``validations`` of them over the budget ``max_time``.

    Raises:
        UserError: no wall-clock budget to spread them over, or one Lightning cannot read.
    """
    if max_time is None:
        raise UserError(
            f"budget.validations={validations} spreads validations over a wall-clock budget, "
            "but trainer.max_time is not set; set it (e.g. trainer.max_time=00:01:00:00) or "
            "use trainer.val_check_interval instead"
        )
    try:
        # Lightning's own reading of max_time, so a form the Trainer refuses is refused here.
        seconds = Timer(duration=max_time).time_remaining()
    except (MisconfigurationException, TypeError, AttributeError):
        raise UserError(
            f"trainer.max_time={max_time!r} is not a duration; write it DD:HH:MM:SS, "
            "e.g. 00:01:00:00"
        ) from None
    assert seconds is not None
    return timedelta(seconds=seconds / validations)


def find_budget(trainer: pl.Trainer | None) -> TrainingBudget | None:
    """The run's :class:`TrainingBudget`, if one is attached to ``trainer``."""
    if trainer is None:
        return None
    return next((cb for cb in trainer.callbacks if isinstance(cb, TrainingBudget)), None)


class BudgetProgressBar(RichProgressBar):
    """Rich progress bar that counts epochs without a fake maximum and shows the time left.

    Lightning shows ``Epoch 20/-2`` when ``max_epochs`` is -1; here the epoch stands alone and
    ``left`` counts the minutes until the budget stops training.
    """

    def _get_train_description(self, current_epoch: int) -> str:
        max_epochs = self.trainer.max_epochs
        description = f"Epoch {current_epoch}"
        if max_epochs is not None and max_epochs > 0:
            description += f"/{max_epochs - 1}"
        return f"{description:{len(self.validation_description)}}"

    def get_metrics(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> dict[str, Any]:
        metrics = super().get_metrics(trainer, pl_module)
        left = time_left(find_budget(trainer))
        if left is not None and trainer.training:
            metrics["left"] = left
        return metrics


def time_left(budget: TrainingBudget | None) -> str | None:
    """``M:SS`` until ``budget`` stops training (``None`` without a wall-clock budget)."""
    horizon = budget.horizon() if budget is not None else None
    if budget is None or horizon is None:
        return None
    minutes, seconds = divmod(int(max(horizon - budget.elapsed(), 0.0)), 60)
    return f"{minutes}:{seconds:02d}"
