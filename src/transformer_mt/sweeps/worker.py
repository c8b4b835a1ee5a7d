"""One worker of a study: ask a trial, run it as a Hydra job, tell how it ended; repeat.

:class:`StudyWorker` checks everything it can before the first trial, so that bad input costs
one ``error:`` line, not a failed night.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import optuna
from hydra.core.utils import JobReturn, JobStatus
from omegaconf import DictConfig, OmegaConf
from optuna.trial import TrialState

from transformer_mt.errors import UserError
from transformer_mt.files import write_text_atomic
from transformer_mt.sweeps import host
from transformer_mt.sweeps import study as st
from transformer_mt.sweeps.summary import RESULT_FILE, JobResult, write_summary
from transformer_mt.training import pruning as tp

log = logging.getLogger(__name__)

#: Trial states that count towards ``n_trials`` (a failed trial is replaced by a new one).
COUNTED = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING, TrialState.WAITING)


def _value_text(value: Any) -> str:
    """A sampled value as a Hydra override value (strings with grammar characters quoted)."""
    text = str(value)
    if isinstance(value, str) and any(c in text for c in " ,()[]{}='\"\\:"):
        return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"
    return text


def check_writable(directory: Path) -> None:
    """The sweep directory exists (or is created) and takes a file, else a UserError."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        probe = directory / f".write-test-{os.getpid()}"
        probe.write_text("")
        probe.unlink()
    except OSError as err:
        raise UserError(
            f"cannot write the sweep directory {directory}: {err.strerror or err}; choose a "
            "writable hydra.sweep.dir"
        ) from None


def _why_failed(job: JobReturn) -> str:
    """The cause of a failed trial, one line: its error, or the metric it did not report."""
    if job.status == JobStatus.FAILED:
        return " ".join(str(job._return_value).split())[:300]
    return (
        "no value of the optimized metric (the trial ended before its first validation, or "
        "validation gave none); validate inside the budget: lower "
        "trainer.check_val_every_n_epoch or trainer.val_check_interval, keep "
        "trainer.limit_val_batches above 0, and name a logged metric in optimized_metric"
    )


def _host_wait(check: Any) -> host.HostWait:
    """``hydra.sweeper.host_check`` as a :class:`host.HostWait`, or a UserError."""
    check = check or {}
    min_ratio = float(check.get("min_ratio") or 0.0)
    # HostCheckConf holds the defaults; without a min_ratio nothing waits.
    minutes = float(check.get("max_wait_minutes") or 0.0)
    if not 0.0 <= min_ratio <= 1.0:
        raise UserError(
            f"hydra.sweeper.host_check.min_ratio must be within [0, 1] (a share of the study's "
            f"first measurement; 0: never wait), got {min_ratio}"
        )
    if minutes < 0:
        raise UserError(f"hydra.sweeper.host_check.max_wait_minutes must be >= 0, got {minutes}")
    return host.HostWait(min_ratio=min_ratio, max_wait_s=60.0 * minutes)


class TrialsKeepFailing(RuntimeError):
    """Trial after trial fails: the setup is broken, and more trials would fail the same way."""


class StudyWorker:
    """The search loop of one worker; everything is checked in ``__init__``."""

    def __init__(
        self, settings: DictConfig, config: DictConfig, launcher: Any, arguments: list[str]
    ) -> None:
        self.settings, self.config, self.launcher = settings, config, launcher
        self.sweep_dir = Path(str(config.hydra.sweep.dir)).absolute()
        params = settings.get("params")
        params = OmegaConf.to_container(params) if params is not None else {}
        self.space, self.fixed = st.search_space(params, list(arguments))  # type: ignore[arg-type]
        if not self.space:
            raise UserError(
                "the search space is empty: give hydra.sweeper.params or a sweep such as "
                "model.dropout=choice(0.1,0.2) on the command line"
            )
        st.check_keys(self.space, config)
        check_writable(self.sweep_dir)
        self.n_trials = int(settings.n_trials)
        if self.n_trials < 0:
            raise UserError(f"hydra.sweeper.n_trials must be >= 0, got {self.n_trials}")
        self.host_wait = _host_wait(settings.get("host_check"))  # before the storage is touched
        optuna.logging.disable_default_handler()  # through Hydra's logging: console and file
        optuna.logging.enable_propagation()
        self.url = st.storage_url(settings.get("storage"), self.sweep_dir)
        self.heartbeat = int(settings.get("heartbeat_interval") or 0)
        self.storage = tp.open_storage(
            self.url, heartbeat_interval=self.heartbeat, max_retry=int(settings.max_retry)
        )
        if not hasattr(self.storage, "record_heartbeat"):  # a journal file
            self.heartbeat = 0
        self.study = st.open_study(
            self.storage,
            str(settings.study_name),
            str(settings.direction),
            sampler=st.make_sampler(settings.sampler),
            pruner=tp.make_pruner(settings.pruner),
        )
        st.check_same_space(self.study, self.space)
        points = settings.get("enqueue") or []
        points = [OmegaConf.to_container(p) if OmegaConf.is_config(p) else p for p in points]
        if any(not isinstance(p, dict) for p in points):
            raise UserError(
                "hydra.sweeper.enqueue must be a list of mappings, e.g. "
                "[{model.dropout: 0.1, optimizer.lr: 2.1e-3}]"
            )
        st.enqueue_points(self.study, self.space, points)  # type: ignore[arg-type]
        # Every measurement runs on the threads of the first, taken before any trial set its own.
        self.host_threads: int | None = None
        self.host_cpu = host.cpu_model()
        # Trials read the storage from the environment (a URL may carry a password).
        os.environ[tp.STORAGE_ENV] = self.url

    # ------------------------------------------------------------------ the loop

    def run(self) -> list[JobReturn]:
        # Atomic: the workers of one sweep directory all write it (with the same content).
        write_text_atomic(self.sweep_dir / "multirun.yaml", OmegaConf.to_yaml(self.config))
        trials = self.study.get_trials(deepcopy=False)
        waiting = sum(t.state == TrialState.WAITING for t in trials)
        log.info(
            "study %r in %s: %d trials wanted, %d there (%d of them given points still to "
            "run); sweep directory %s",
            self.study.study_name,
            tp.redact(self.url),
            self.n_trials,
            len(trials),
            waiting,
            self.sweep_dir,
        )
        returns: list[JobReturn] = []
        limit, failures = int(self.settings.get("max_failures_in_a_row") or 0), 0
        while (trial := self._next_trial()) is not None:
            job, state = self._run_trial(trial)
            returns.append(job)
            # A trial without a metric failed too, and would be replaced forever.
            failures = failures + 1 if state == TrialState.FAIL else 0
            if limit and failures >= limit:
                self._finish()
                raise TrialsKeepFailing(
                    f"{failures} trials in a row failed, the last with: {_why_failed(job)}; "
                    f"the worker stops (hydra.sweeper.max_failures_in_a_row={limit}); see "
                    f"{self.sweep_dir / 'summary.md'}"
                )
        returns += self._confirm()
        self._finish()
        return returns

    def _next_trial(self) -> optuna.Trial | None:
        """A trial to run, or None when the study holds ``n_trials`` (waiting for live ones)."""
        while True:
            if self.heartbeat:
                optuna.storages.fail_stale_trials(self.study)
            trials = self.study.get_trials(deepcopy=False)
            # Given points wait in the queue and count: only those within n_trials run now,
            # the rest stay for an invocation that asks for more.
            counted = sorted(t.number for t in trials if t.state in COUNTED)[: self.n_trials]
            running = [t for t in trials if t.state == TrialState.RUNNING]
            waiting = {t.number for t in trials if t.state == TrialState.WAITING}
            if len(counted) < self.n_trials or waiting.intersection(counted):
                break
            if not (running and self.heartbeat):
                return None
            # Other workers' trials still run: stay, to take over a retry if one of them dies.
            time.sleep(min(self.heartbeat, 5))
        trial = self.study.ask(self.space)
        counted = sorted(
            t.number for t in self.study.get_trials(deepcopy=False) if t.state in COUNTED
        )
        if trial.number not in counted[: self.n_trials]:
            # Two workers asked at the same moment for the last place: the later one yields.
            trial.set_user_attr("surplus", True)
            self.study.tell(trial, state=TrialState.FAIL)
            return None
        return trial

    def _overrides(self, params: dict[str, Any]) -> list[str]:
        return [*self.fixed, *(f"{k}={_value_text(v)}" for k, v in params.items())]

    def _run_trial(self, trial: optuna.Trial) -> tuple[JobReturn, TrialState]:
        overrides = [*self._overrides(trial.params), f"hydra.sweeper.trial_id={trial._trial_id}"]
        log.info("trial %d: %s", trial.number, " ".join(self._overrides(trial.params)))
        with self._beating(trial._trial_id):  # a wait for a slow machine beats too
            speed = self._host_speed(f"trial {trial.number}")
            trial.set_user_attr(host.TRIAL_ATTR, speed.attr())
            [job] = self.launcher.launch([overrides], initial_job_idx=trial.number)
        state, value = self._outcome(trial, job)
        if state == TrialState.COMPLETE:
            self.study.tell(trial, value)
        else:
            self.study.tell(trial, state=state)
        self._record(job, trial.number, state.name, trial.params)
        return job, state

    def _outcome(self, trial: optuna.Trial, job: JobReturn) -> tuple[TrialState, float | None]:
        if job.status == JobStatus.FAILED:
            return TrialState.FAIL, None
        value = st.finite(job._return_value)
        if tp.PRUNED_AT in self.storage.get_trial(trial._trial_id).user_attrs:
            return TrialState.PRUNED, value
        return (TrialState.COMPLETE, value) if value is not None else (TrialState.FAIL, None)

    def _host_speed(self, label: str) -> host.HostSpeed:
        """The machine's speed before ``label`` runs, against the study's first measurement
        (its yardstick); with ``host_check.min_ratio`` it waits while the machine is slower."""
        cpu = self.host_cpu
        reference = self.study.user_attrs.get(host.REFERENCE)
        if reference is None:
            gflops = self._measure_host()
            self.study.set_user_attr(host.REFERENCE, {"gflops": round(gflops, 1), "cpu": cpu})
            log.info(
                "the machine before %s (%s): %.0f fp32 GFLOP/s, the study's yardstick",
                label,
                cpu,
                gflops,
            )
            return host.HostSpeed(gflops, 1.0, cpu)
        if reference.get("cpu") != cpu:
            log.warning(
                "%s runs on %r, the study's first measurement was on %r: values measured in "
                "wall clock on two kinds of machine are not comparable",
                label,
                cpu,
                reference.get("cpu"),
            )
        first = float(reference["gflops"])
        gflops, waited = host.measure_until_fast(self._measure_host, first, self.host_wait)
        log.info(
            "the machine before %s: %.0f fp32 GFLOP/s, %.2fx the study's first",
            label,
            gflops,
            gflops / first,
        )
        return host.HostSpeed(gflops, gflops / first, cpu, waited)

    def _measure_host(self) -> float:
        import torch

        before = torch.get_num_threads()
        if self.host_threads is None:
            self.host_threads = before
        torch.set_num_threads(self.host_threads)
        try:
            return host.matmul_gflops()
        finally:
            torch.set_num_threads(before)

    @contextlib.contextmanager
    def _beating(self, trial_id: int) -> Iterator[None]:
        """Record the trial's heartbeat every ``heartbeat_interval`` seconds while it runs."""
        if not self.heartbeat:
            yield
            return
        stop = threading.Event()

        def beat() -> None:
            while not stop.wait(self.heartbeat):
                self.storage.record_heartbeat(trial_id)

        self.storage.record_heartbeat(trial_id)
        thread = threading.Thread(target=beat, name="optuna-heartbeat", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()

    def _record(self, job: JobReturn, number: int, state: str, params: dict[str, Any]) -> None:
        """Add the trial's number, state and parameters to its ``sweep_result.json``."""
        run_dir = Path(str(OmegaConf.select(job.hydra_cfg, "hydra.runtime.output_dir", default="")))
        path = run_dir / RESULT_FILE
        if not path.is_file():
            return
        result = JobResult.read(path)
        result.trial, result.state, result.params = number, state, dict(params)
        result.overrides = [o for o in result.overrides if not o.startswith("hydra.")]
        for key in params:
            result.overrides = [o for o in result.overrides if o.split("=", 1)[0] != key]
        if state == "PRUNED":
            result.status = "pruned"
        result.write(path)
        write_summary(self.sweep_dir, maximize=self.study.direction.name == "MAXIMIZE")

    # ------------------------------------------------------------------ after the search

    def _confirm(self) -> list[JobReturn]:
        """Re-run the best ``confirm.top_k`` completed trials with ``confirm.overrides``."""
        confirm = self.settings.confirm
        top_k = int(confirm.top_k or 0)
        if top_k <= 0:
            return []
        done = [t for t in self.study.trials if t.state == TrialState.COMPLETE]
        reverse = self.study.direction.name == "MAXIMIZE"
        best = sorted(done, key=lambda t: t.value, reverse=reverse)[:top_k]
        returns = []
        for trial in best:
            if not self._claim_confirmation(trial.number):
                log.info("trial %d is confirmed by another worker or invocation", trial.number)
                continue
            overrides = [
                *self._overrides(trial.params),
                *[str(o) for o in confirm.overrides],
                f"hydra.sweep.subdir=confirm_{trial.number}",
            ]
            log.info("confirming trial %d: %s", trial.number, " ".join(overrides))
            speed = self._host_speed(f"the confirmation of trial {trial.number}")
            self.study.set_user_attr(f"confirm_{trial.number}_{host.TRIAL_ATTR}", speed.attr())
            [job] = self.launcher.launch([overrides], initial_job_idx=trial.number)
            value = st.finite(job._return_value) if job.status != JobStatus.FAILED else None
            if value is not None:
                self.study.set_user_attr(f"confirm_{trial.number}", value)
            self._record(job, trial.number, "CONFIRM", trial.params)
            returns.append(job)
        return returns

    def _claim_confirmation(self, number: int) -> bool:
        """True for the one worker, of all invocations on this storage, that confirms ``number``
        (creating an empty marker study is the atomic claim)."""
        name = f"{self.study.study_name}.confirm_{number}"
        try:
            self.storage.create_new_study([self.study.direction], study_name=name)
        except optuna.exceptions.DuplicatedStudyError:
            return False
        return True

    def _finish(self) -> None:
        """``optimization_results.yaml`` and the plots of the study."""
        from transformer_mt.sweeps.plots import write_plots

        done = [t for t in self.study.trials if t.state == TrialState.COMPLETE]
        if done:
            best = self.study.best_trial
            results = {"name": self.study.study_name, "best_trial": best.number}
            results.update(best_params=best.params, best_value=best.value)
            write_text_atomic(
                self.sweep_dir / "optimization_results.yaml", OmegaConf.to_yaml(results)
            )
            log.info("best trial %d: %s = %s", best.number, best.params, best.value)
        if self.settings.get("plots", True):
            write_plots(self.study, self.sweep_dir)
