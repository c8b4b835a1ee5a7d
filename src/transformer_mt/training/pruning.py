"""A sweep trial's side of a study: its storage and pruner, report ``val/bleu`` against the
budget used, stop when told.

:class:`TrialPruning` is in every run; outside a sweeper's trial (``hydra.sweeper.trial_id``)
it only joins DDP's broadcast of rank 0's decision. The pruner sees percent of the budget
(``trainer.max_time``, else planned steps) on a 5% grid, filling the points between validations
with the value known then, so trials that validate at different moments compare at equal steps.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import sys
import time
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.trainer.states import TrainerFn

from transformer_mt.errors import UserError
from transformer_mt.training.budget import find_budget

log = logging.getLogger(__name__)

#: The environment variable through which a sweeper hands its storage URL to its trials (it may
#: hold a password, so it travels neither in overrides nor in the job's saved config).
STORAGE_ENV = "TRANSFORMER_MT_SWEEP_STORAGE"
#: User attribute of a trial that its run stopped on the pruner's word (budget percent reached).
PRUNED_AT = "pruned_at"
PRUNERS = ("none", "median", "successive_halving", "hyperband")

#: System attribute Optuna gives a trial queued with ``enqueue_trial``: the study's given
#: points (``hydra.sweeper.enqueue``).
GIVEN_POINT = "fixed_params"

#: Trials report on a grid of this many percent of their budget (20 points at most).
GRID = 5


def grid_step(percent: int) -> int:
    """The grid point a validation at ``percent`` of the budget reports at."""
    return GRID * (percent // GRID)


class StudyTrial:
    """The running trial of a study, opened from its storage in the job's process."""

    def __init__(self, url: str, study_name: str, trial_id: int, pruner_cfg: Any) -> None:
        import optuna

        self.storage = open_storage(url)
        self.study = optuna.load_study(study_name=study_name, storage=self.storage)
        self.pruner = make_pruner(pruner_cfg)
        self.trial_id = trial_id
        self.reported: int | None = None  # the last grid step reported
        self.last_value: float | None = None

    def report(self, value: float, percent: int) -> bool:
        """Record ``value`` at ``percent`` of the budget; True when the trial should stop."""
        step = grid_step(percent)
        if self.reported is not None and self.last_value is not None:
            # Every grid point since the previous validation gets the value known then.
            for between in range(self.reported + GRID, step, GRID):
                self.storage.set_trial_intermediate_value(self.trial_id, between, self.last_value)
        self.storage.set_trial_intermediate_value(self.trial_id, step, value)
        self.reported, self.last_value = step, value
        frozen = self.storage.get_trial(self.trial_id)
        # Asked for every trial: a pruner records each trial's values as the bar for later ones.
        if not self.pruner.prune(self.study, frozen):
            return False
        if GIVEN_POINT in frozen.system_attrs:
            # A given point is a reference, not a draw to bet on: it runs its whole budget.
            log.info("a given point runs its whole budget: not pruned at %d%%", percent)
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
    url = os.environ.get(STORAGE_ENV)
    if trial_id is None or not url:
        return None
    return StudyTrial(url, str(sweeper.study_name), int(trial_id), sweeper.get("pruner"))


def rerun_as_one_job() -> None:
    """Make Lightning's DDP launcher, which re-runs ``sys.argv``, start the other ranks as this
    job (its overrides in RUN mode), not as a sweep of their own."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN:
        sys.argv = [sys.argv[0], *HydraConfig.get().overrides.task, "hydra.mode=RUN"]


#: What Lightning's DDP launcher sets in its own process to start the other ranks.
DDP_ENVIRONMENT = ("MASTER_ADDR", "MASTER_PORT", "NODE_RANK", "LOCAL_RANK", "WORLD_SIZE")


@contextlib.contextmanager
def one_trial_per_process_group() -> Iterator[None]:
    """Around each job of a sweep: the next trial starts its DDP ranks afresh, not from the
    ``LOCAL_RANK`` and process group Lightning's launcher leaves behind."""
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


# ------------------------------------------------------------ the study's storage and pruner


#: Optuna's journal storage records no heartbeats, so no worker can tell a dead one's trial.
NO_JOURNAL_HEARTBEAT = (
    "a journal file keeps no heartbeats: a worker killed mid-trial leaves its trial RUNNING "
    "(it counts towards n_trials and is never retried); for dead-worker recovery use an "
    "SQLAlchemy storage (sqlite:///<local disk>/study.db, postgresql://...)"
)


#: Missed heartbeats after which a trial's worker counts as dead.
GRACE_BEATS = 10


def open_storage(url: str, *, heartbeat_interval: int | None = None, max_retry: int = 0) -> Any:
    """An Optuna storage for ``url``: a SQLAlchemy URL, or ``journal:<file>`` (journal file).

    Heartbeats mark a trial whose worker died (kill -9, a lost machine) as failed; with
    ``max_retry`` > 0 another worker then runs its parameters again.
    """
    import optuna
    from optuna.storages import RetryFailedTrialCallback

    # Optuna's heartbeat warnings are noise here: sweeps/worker.py beats itself.
    warnings.filterwarnings("ignore", message=".*[Hh]eartbeat.*")
    retry = RetryFailedTrialCallback(max_retry=max_retry) if max_retry > 0 else None
    beat: dict[str, Any] = {}
    if heartbeat_interval:
        beat = {
            "heartbeat_interval": int(heartbeat_interval),
            # Not Optuna's two: a loaded machine can stall a live worker's beat for seconds.
            "grace_period": GRACE_BEATS * int(heartbeat_interval),
            "failed_trial_callback": retry,
        }
    try:
        if url.startswith("journal:"):
            from optuna.storages.journal import JournalFileBackend

            path = url.removeprefix("journal:").removeprefix("//")
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            if heartbeat_interval:
                log.warning(NO_JOURNAL_HEARTBEAT)
            return optuna.storages.JournalStorage(JournalFileBackend(path))
        return _rdb_storage(url, beat)
    except Exception as err:
        raise UserError(
            f"cannot open the study storage {redact(url)}: {' '.join(str(err).split())[:300]}; "
            "check the URL (sqlite:///path.db, postgresql://user@host/db, journal:/path.log) "
            "and that its server or directory is reachable"
        ) from None


#: What a database says when another worker created the study tables a moment before.
_CREATED_MEANWHILE = ("already exists", "duplicate key", "UNIQUE constraint failed")


def _rdb_storage(url: str, beat: dict[str, Any]) -> Any:
    """An RDBStorage; workers that start together on a new database, and race to create its
    tables, all get one."""
    import optuna

    for attempt in range(4):
        try:
            return optuna.storages.RDBStorage(url, skip_compatibility_check=False, **beat)
        except Exception as err:
            if not any(m in str(err) for m in _CREATED_MEANWHILE):
                raise
            time.sleep(0.2 * (attempt + 1))
    return optuna.storages.RDBStorage(url, skip_compatibility_check=False, **beat)


def redact(url: str) -> str:
    """``url`` without its password, for messages and logs."""
    head, sep, tail = url.partition("@")
    if not sep or "://" not in head:
        return url
    scheme, _, credentials = head.partition("://")
    user = credentials.split(":", 1)[0]
    return f"{scheme}://{user}:***@{tail}" if ":" in credentials else url


def make_pruner(cfg: Mapping[str, Any] | None) -> Any:
    """The configured pruner; resources are percent of the trial's budget (1..100)."""
    import optuna.pruners as pruners

    cfg = dict(cfg or {})
    name = str(cfg.pop("name", "none"))
    if name == "none":
        return pruners.NopPruner()
    if name == "median":
        keys = ("n_startup_trials", "n_warmup_steps", "interval_steps", "n_min_trials")
        return pruners.MedianPruner(**{k: int(cfg[k]) for k in keys if cfg.get(k) is not None})
    if name in ("successive_halving", "hyperband"):
        min_resource = int(cfg.get("min_resource") or 10)
        factor = int(cfg.get("reduction_factor") or 3)
        if name == "successive_halving":
            return pruners.SuccessiveHalvingPruner(
                min_resource=min_resource, reduction_factor=factor
            )
        return pruners.HyperbandPruner(
            min_resource=min_resource, max_resource=100, reduction_factor=factor
        )
    raise UserError(f"hydra.sweeper.pruner.name must be one of {PRUNERS}, got {name!r}")
