"""A sweep trial's side of pruning: report ``val/bleu`` against the budget used, stop when told.

:class:`TrialPruning` is added to every run by :func:`transformer_mt.training.run.build`. In a
trial of :class:`transformer_mt.training.sweeper.OptunaStudySweeper` (the job's config has
``hydra.sweeper.trial_id``) it reports the monitored metric at each validation and stops the
run at once when the study's pruner says so; the checkpoints written so far stay. Elsewhere it
does nothing, except under DDP, where every rank joins the one broadcast of rank 0's decision,
so that all ranks stop together.

The pruner sees the budget as a percentage: of ``trainer.max_time`` when set (the
:class:`TrainingBudget` clock), else of the planned optimizer steps, on a grid of 5%. A
validation at 37% reports at 35% and fills every grid point since the previous validation
with the value known then, so trials that validate at different moments still compare at the
same steps (the median pruner compares equal steps only).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import sys
from collections.abc import Iterator
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.trainer.states import TrainerFn

from transformer_mt.training.budget import find_budget

log = logging.getLogger(__name__)

#: Trials report on a grid of this many percent of their budget (20 points at most).
GRID = 5


def grid_step(percent: int) -> int:
    """The grid point a validation at ``percent`` of the budget reports at."""
    return GRID * (percent // GRID)


class StudyTrial:
    """The running trial of a study, opened from its storage in the job's process."""

    def __init__(self, url: str, study_name: str, trial_id: int, pruner_cfg: Any) -> None:
        import optuna

        from transformer_mt.training import study as st

        self.storage = st.open_storage(url)
        self.study = optuna.load_study(study_name=study_name, storage=self.storage)
        self.pruner = st.make_pruner(pruner_cfg)
        self.trial_id = trial_id
        self.reported: int | None = None  # the last grid step reported
        self.last_value: float | None = None

    def report(self, value: float, percent: int) -> bool:
        """Record ``value`` at ``percent`` of the budget; True when the trial should stop."""
        from transformer_mt.training.study import PRUNED_AT

        step = grid_step(percent)
        if self.reported is not None and self.last_value is not None:
            # Every grid point since the previous validation gets the value known then.
            for between in range(self.reported + GRID, step, GRID):
                self.storage.set_trial_intermediate_value(self.trial_id, between, self.last_value)
        self.storage.set_trial_intermediate_value(self.trial_id, step, value)
        self.reported, self.last_value = step, value
        frozen = self.storage.get_trial(self.trial_id)
        if not self.pruner.prune(self.study, frozen):
            return False
        self.storage.set_trial_user_attr(self.trial_id, PRUNED_AT, percent)
        return True


def trial_from_hydra() -> StudyTrial | None:
    """The trial this job runs for, when it is a job of the Optuna study sweeper."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return None
    sweeper = HydraConfig.get().sweeper
    trial_id = sweeper.get("trial_id") if hasattr(sweeper, "get") else None
    url = os.environ.get("TRANSFORMER_MT_SWEEP_STORAGE")
    if trial_id is None or not url:
        return None
    return StudyTrial(url, str(sweeper.study_name), int(trial_id), sweeper.get("pruner"))


def rerun_as_one_job() -> None:
    """Make Lightning's DDP launcher start the other ranks as this job, not as the sweep.

    Lightning starts rank 1.. by re-running ``sys.argv``; in a sweep that is the whole ``-m``
    command, and each rank would run a sweep of its own. The job's own overrides (the trial's
    parameters included) in RUN mode make every rank train this trial.
    """
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN:
        sys.argv = [sys.argv[0], *HydraConfig.get().overrides.task, "hydra.mode=RUN"]


#: What Lightning's DDP launcher sets in its own process to start the other ranks.
DDP_ENVIRONMENT = ("MASTER_ADDR", "MASTER_PORT", "NODE_RANK", "LOCAL_RANK", "WORLD_SIZE")


@contextlib.contextmanager
def one_trial_per_process_group() -> Iterator[None]:
    """Around each job of a sweep: the next trial starts its DDP ranks afresh.

    Lightning's launcher leaves ``LOCAL_RANK`` and friends in the environment and the process
    group open; the next trial in the same process would then take its ranks as started from
    outside and wait for ranks that exited with the previous trial.
    """
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:
        yield
        return
    saved = {name: os.environ.get(name) for name in DDP_ENVIRONMENT}
    try:
        yield
    finally:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def budget_percent(trainer: pl.Trainer, pl_module: pl.LightningModule) -> int:
    """Percent (1..100) of the run's budget used: seconds of max_time, else planned steps."""
    budget = find_budget(trainer)
    if budget is not None and budget.seconds:
        used = budget.elapsed() / budget.seconds
    else:
        planned = getattr(pl_module, "planned_steps", lambda: None)()
        used = trainer.global_step / planned if planned else 1.0
    return min(max(math.ceil(100 * used), 1), 100)


class TrialPruning(pl.Callback):
    """Report ``monitor`` to the sweep's trial at each validation; stop when it is pruned."""

    def __init__(self, trial: StudyTrial | None = None, monitor: str = "val/bleu") -> None:
        self.trial, self.monitor = trial, monitor
        self.pruned_at: int | None = None

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.sanity_checking or trainer.state.fn != TrainerFn.FITTING:
            return
        prune = False
        percent = budget_percent(trainer, pl_module)
        if self.trial is not None and trainer.is_global_zero:
            value = trainer.callback_metrics.get(self.monitor)
            if value is not None and math.isfinite(float(value)):
                prune = self.trial.report(float(value), percent)
        if trainer.world_size > 1:  # one decision, rank 0's, for every rank
            prune = bool(trainer.strategy.broadcast(prune, src=0))
        if prune:
            self.pruned_at = percent
            trainer.should_stop = True
            log.info(
                "trial pruned at %d%% of its budget (%s behind the pruner's bar)",
                percent,
                self.monitor,
            )
