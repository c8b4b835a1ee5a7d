"""Learning-rate schedules: the paper's warmup + inverse square root, and decays to zero."""

from __future__ import annotations

import math


def inverse_sqrt_schedule(step: int, warmup_steps: int) -> float:
    """Learning-rate factor of the paper (section 5.3), normalised to peak at 1.0.

    ``min(step / warmup, sqrt(warmup / step))`` for ``step`` from 1: the optimizer's ``lr`` is
    the peak (the paper's is :func:`paper_peak_lr`).
    """
    step = max(step, 1)
    if warmup_steps <= 0:
        return 1.0 / math.sqrt(step)
    return min(step / warmup_steps, math.sqrt(warmup_steps / step))


SCHEDULES = ("inverse_sqrt", "linear", "cosine")


def decay(schedule: str, progress: float) -> float:
    """Factor after the warmup at ``progress`` in [0, 1] of the budget: 1 at 0, 0 at 1."""
    progress = min(max(progress, 0.0), 1.0)
    if schedule == "linear":
        return 1.0 - progress
    return 0.5 * (1.0 + math.cos(math.pi * progress))


def lr_factor(
    step: int,
    warmup_steps: int,
    schedule: str,
    total_steps: int | None,
    time_progress: float | None = None,
    *,
    warmup_progress: float | None = None,
) -> float:
    """Learning-rate factor (peak 1.0) at optimizer step ``step`` (counted from 1).

    ``inverse_sqrt`` needs no horizon. ``linear`` and ``cosine`` share its warmup, then decay
    to 0 at the end of the stated budget, which trains better than a schedule still well above
    zero when the budget runs out (Li et al., 2020, "Budgeted Training").

    Args:
        total_steps: the step budget, or ``None``; zero is reached one step after the last,
            so the last step still learns.
        time_progress: the fraction of a wall-clock budget used since the warmup ended
            (``TrainingBudget``), or ``None``; with both budgets, whichever runs out first.
        warmup_progress: the fraction of the warmup done, from a wall-clock budget that may
            end it early; ``None`` means ``step / warmup_steps``.
    """
    if schedule == "inverse_sqrt":
        return inverse_sqrt_schedule(step, warmup_steps)
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown lr schedule {schedule!r}; choose one of {', '.join(SCHEDULES)}")
    steps_known = total_steps is not None and total_steps > warmup_steps
    if not steps_known and time_progress is None:
        raise ValueError(
            f"the {schedule} schedule decays over the whole run, so it needs a budget: a number "
            f"of steps larger than warmup_steps ({warmup_steps}), got {total_steps}, or a "
            "wall-clock budget; set trainer.max_time (e.g. 00:01:00:00), trainer.max_epochs or "
            "trainer.max_steps"
        )
    step = max(step, 1)
    if warmup_progress is None:
        warmup_progress = step / warmup_steps if warmup_steps > 0 else 1.0
    if warmup_progress < 1.0:
        return warmup_progress
    progress = 0.0 if time_progress is None else time_progress
    if steps_known:
        assert total_steps is not None
        progress = max(progress, (step - warmup_steps) / (total_steps - warmup_steps + 1))
    return decay(schedule, progress)


def paper_peak_lr(d_model: int, warmup_steps: int, scale: float = 1.0) -> float:
    """Peak of the paper's schedule: ``scale * d_model^-0.5 * warmup^-0.5`` (7.0e-4 for base)."""
    return scale * d_model**-0.5 * warmup_steps**-0.5
