"""The Optuna sweeper behind ``python train.py -m hparams_search=...`` (a Hydra sweeper plugin).

Selected by ``override /hydra/sweeper: optuna_study``; the plugin class in
``src/hydra_plugins/transformer_mt_sweeper`` calls :func:`sweep`. One invocation is one worker
(:mod:`transformer_mt.sweeps.worker`); N workers on one storage share the study, and a dead
worker's trial is failed by the others' heartbeat check (docs/scaling.md). Only this module's
configuration is imported at Hydra start-up; Optuna loads when a sweep runs.
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig

log = logging.getLogger(__name__)


@dataclass
class SamplerConf:
    """``hydra.sweeper.sampler``: ``tpe`` or ``random``; other keys go to TPESampler."""

    name: str = "tpe"
    # Each trial's seed derives from (seed, trial number): reproducible, distinct per trial.
    seed: int | None = None
    n_startup_trials: int = 10
    multivariate: bool = False


@dataclass
class PrunerConf:
    """``hydra.sweeper.pruner``; resources and steps are percent of a trial's budget."""

    name: str = "none"  # none | median | successive_halving | hyperband
    n_startup_trials: int = 4  # median: trials that finish before any is pruned
    n_warmup_steps: int = 10  # median: percent of the budget before a trial may be pruned
    min_resource: int = 10  # successive_halving / hyperband: the first rung, in percent
    reduction_factor: int = 3  # successive_halving / hyperband: 1 in this many goes on


@dataclass
class ConfirmConf:
    """``hydra.sweeper.confirm``: re-run the best ``top_k`` trials with these overrides."""

    top_k: int = 0
    overrides: list[str] = field(default_factory=list)


@dataclass
class HostCheckConf:
    """``hydra.sweeper.host_check``: the machine's speed, measured before every trial."""

    # Wait while the machine runs below this share of the study's first measurement; 0 never.
    min_ratio: float = 0.0
    # The longest wait; then the trial runs anyway, its stored ratio saying on what.
    max_wait_minutes: float = 30.0


@dataclass
class OptunaStudySweeperConf:
    # Hydra accepts plugin classes from the hydra_plugins namespace only: the thin class there
    # hands the work to sweep() below.
    _target_: str = "hydra_plugins.transformer_mt_sweeper.optuna_study.OptunaStudySweeper"
    direction: str = "maximize"
    study_name: str = "study"
    # null: sqlite:///<sweep dir>/optuna.db. Any SQLAlchemy URL, or journal:<file>.
    storage: str | None = None
    # Trials the study holds in the end (all workers and invocations; failed ones not counted).
    n_trials: int = 10
    sampler: SamplerConf = field(default_factory=SamplerConf)
    pruner: PrunerConf = field(default_factory=PrunerConf)
    params: dict[str, Any] | None = None
    # Points to run first, each a mapping of searched keys to values (the rest are drawn).
    enqueue: list[Any] = field(default_factory=list)
    # Seconds between a running trial's heartbeats (0: none); a silent trial is failed and
    # run again up to max_retry times.
    heartbeat_interval: int = 30
    max_retry: int = 0
    # A worker stops after this many failed trials in a row (a broken setup, not a bad draw).
    max_failures_in_a_row: int = 5
    confirm: ConfirmConf = field(default_factory=ConfirmConf)
    host_check: HostCheckConf = field(default_factory=HostCheckConf)
    plots: bool = True
    # Set by the sweeper for each of its jobs: the storage id of the trial the job reports to.
    trial_id: int | None = None


ConfigStore.instance().store(
    group="hydra/sweeper",
    name="optuna_study",
    node=OptunaStudySweeperConf,
    provider="transformer_mt",
)


def sweep(settings: DictConfig, config: DictConfig, launcher: Any, arguments: list[str]) -> Any:
    """Run one worker of the study; bad input exits with one ``error:`` line before any trial."""
    from transformer_mt.errors import EXIT_RUNTIME_ERROR, EXIT_USER_ERROR, UserError
    from transformer_mt.sweeps.worker import StudyWorker, TrialsKeepFailing

    try:
        worker = StudyWorker(settings, config, launcher, arguments)
    except UserError as err:
        _exit(err, EXIT_USER_ERROR)
    try:
        return worker.run()
    except TrialsKeepFailing as err:
        _exit(err, EXIT_RUNTIME_ERROR)


def _exit(err: Exception, code: int) -> None:
    sys.stdout.flush()
    print(f"error: {' '.join(str(err).split())}", file=sys.stderr, flush=True)
    sys.exit(code)
