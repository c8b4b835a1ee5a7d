"""Sweep bookkeeping: one result file per job, one summary table per sweep.

In a multirun, :class:`SweepSummary` (a Hydra callback) writes each job's
``sweep_result.json``, rewrites the ranked ``summary.csv``/``summary.md`` from all of them
after every job (so a sweep that stops early, or whose jobs run elsewhere on a shared file
system, still has one), and at the end dumps an Optuna study's ``optuna_trials.csv``.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import math
import traceback
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hydra.core.utils import JobReturn, JobStatus
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from transformer_mt.errors import JobFailed
from transformer_mt.files import write_text_atomic

log = logging.getLogger(__name__)

RESULT_FILE = "sweep_result.json"
SUMMARY_CSV = "summary.csv"
SUMMARY_MD = "summary.md"


@dataclass
class JobResult:
    """What one sweep job left behind (the content of its ``sweep_result.json``)."""

    job: int
    status: str  # completed | pruned | failed | no_metric
    metric: str | None
    value: float | None
    overrides: list[str] = field(default_factory=list)
    run_dir: str = ""
    error: str | None = None
    traceback: str | None = None
    # Optuna sweeps: trial number, state and sampled parameters (not in the overrides).
    trial: int | None = None
    state: str | None = None
    params: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def read(cls, path: Path) -> JobResult:
        """Load a result file written by :meth:`write`."""
        return cls(**json.loads(path.read_text(encoding="utf-8")))

    def write(self, path: Path) -> None:
        """Write this result as JSON (atomically: a reader never sees half a file)."""
        write_text_atomic(path, json.dumps(asdict(self), indent=2) + "\n")


def _metric_value(value: Any, metric: str | None = None) -> float | None:
    """A finite float from a job's return value, else ``None``; for a dict (evaluate.py's)
    ``metric`` is a dotted path into it (``metrics.bleu``)."""
    if isinstance(value, Mapping) and metric:
        for part in metric.split("."):
            value = value.get(part) if isinstance(value, Mapping) else None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def job_result(config: DictConfig, job_return: JobReturn) -> JobResult:
    """Turn Hydra's :class:`JobReturn` into a :class:`JobResult`."""
    metric = OmegaConf.select(config, "optimized_metric", default=None)
    run_dir = str(OmegaConf.select(config, "hydra.runtime.output_dir", default="") or "")
    job_num = OmegaConf.select(config, "hydra.job.num", default=-1)
    result = JobResult(
        job=int(job_num) if job_num is not None else -1,
        status="completed",
        metric=metric,
        value=None,
        overrides=[str(o) for o in (job_return.overrides or [])],
        run_dir=run_dir,
    )
    if job_return.status == JobStatus.FAILED:
        # JobReturn.return_value re-raises the job's exception; keep it as text.
        error = job_return._return_value
        result.status = "failed"
        if isinstance(error, JobFailed):  # a user error, already one line with its fix
            result.error = str(error)
        elif isinstance(error, BaseException):
            result.error = f"{type(error).__name__}: {error}"
            result.traceback = "".join(
                traceback.format_exception(type(error), error, error.__traceback__)
            )
        else:
            result.error = str(error)
        return result
    result.value = _metric_value(job_return.return_value, metric)
    if result.value is None:
        result.status = "no_metric"
        result.error = (
            f"the job returned {job_return.return_value!r}, not a number for "
            f"optimized_metric={metric!r}"
        )
    return result


def collect(sweep_dir: Path) -> list[JobResult]:
    """Every ``sweep_result.json`` below ``sweep_dir``, in job order."""
    results = []
    for path in sweep_dir.rglob(RESULT_FILE):
        try:
            results.append(JobResult.read(path))
        except (OSError, ValueError, TypeError) as err:
            log.warning("skipping unreadable sweep result %s: %s", path, err)
    return sorted(results, key=lambda r: r.job)


def rank(results: list[JobResult], maximize: bool = True) -> list[JobResult]:
    """Best first: finished runs by value, then pruned ones by the value they reached, then
    the others by job number (a pruned trial's value is from part of its budget)."""

    def by_value(group: list[JobResult]) -> list[JobResult]:
        return sorted(group, key=lambda r: (-r.value if maximize else r.value, r.job))  # type: ignore[operator]

    scored = [r for r in results if r.value is not None]
    finished = by_value([r for r in scored if r.status != "pruned"])
    pruned = by_value([r for r in scored if r.status == "pruned"])
    unscored = [r for r in results if r.value is None]
    return finished + pruned + sorted(unscored, key=lambda r: r.job)


def _split_override(override: str) -> tuple[str, str]:
    key, _, value = override.partition("=")
    return key, value


def summary_table(results: list[JobResult]) -> tuple[list[str], list[list[str]], list[str]]:
    """Header, rows and the overrides shared by every job (left out of the rows); each
    override that differs between jobs gets its own column."""
    per_job = [
        {k: v for k, v in map(_split_override, r.overrides) if not k.startswith("hydra.")}
        for r in results
    ]
    searched: list[str] = []  # sampled parameters: always a column, never "shared"
    for result in results:
        searched.extend(k for k in result.params if k not in searched)
    keys: list[str] = []
    for overrides in per_job:
        keys.extend(k for k in overrides if k not in keys and k not in searched)
    common = [k for k in keys if all(k in o for o in per_job) and len({o[k] for o in per_job}) == 1]
    varying = [*searched, *(k for k in keys if k not in common)]
    for overrides, result in zip(per_job, results):
        overrides.update({k: str(v) for k, v in result.params.items()})
    metric = next((r.metric for r in results if r.metric), None) or "value"
    optuna = any(r.trial is not None for r in results)
    header = ["rank", "job", *(["trial", "state"] if optuna else []), *varying, metric]
    header += ["status", "error", "run_dir"]
    rows = []
    for position, (result, overrides) in enumerate(zip(results, per_job), start=1):
        trial = [str(result.trial if result.trial is not None else ""), result.state or ""]
        rows.append(
            [
                str(position) if result.value is not None else "-",
                str(result.job),
                *(trial if optuna else []),
                *[overrides.get(k, "") for k in varying],
                "" if result.value is None else f"{result.value:.4f}",
                result.status,
                result.error or "",
                result.run_dir,
            ]
        )
    shared = [f"{k}={per_job[0][k]}" for k in common] if per_job else []
    return header, rows, shared


def _md_cell(text: str) -> str:
    text = text.replace("|", "\\|").replace("\n", " ")
    return text if len(text) <= 200 else text[:197] + "..."


def write_summary(sweep_dir: Path, maximize: bool = True) -> list[JobResult]:
    """Write ``summary.csv`` and ``summary.md`` into ``sweep_dir``; return the ranked results."""
    results = rank(collect(sweep_dir), maximize=maximize)
    if not results:
        return results
    header, rows, shared = summary_table(results)
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(header)
    writer.writerows(rows)
    write_text_atomic(sweep_dir / SUMMARY_CSV, buffer.getvalue())
    done = sum(r.status == "completed" for r in results)
    pruned = sum(r.status == "pruned" for r in results)
    lines = [
        f"# Sweep summary: {sweep_dir}",
        "",
        f"{len(results)} runs, {done} completed, {pruned} pruned, "
        f"{len(results) - done - pruned} failed or without a metric; best "
        f"{'highest' if maximize else 'lowest'} first (pruned runs after the completed ones).",
        "",
    ]
    if shared:
        lines += ["Shared overrides: `" + " ".join(shared) + "`", ""]
    # The run_dir column stays in the CSV; in Markdown the job number finds it.
    md_header = header[:-1]
    lines.append("| " + " | ".join(md_header) + " |")
    lines.append("|" + "---|" * len(md_header))
    lines += ["| " + " | ".join(_md_cell(c) for c in row[:-1]) + " |" for row in rows]
    write_text_atomic(sweep_dir / SUMMARY_MD, "\n".join(lines) + "\n")
    return results


def _maximize(config: DictConfig, default: str) -> bool:
    """The sweep's direction: Optuna's ``hydra.sweeper.direction`` or the callback's default."""
    direction = OmegaConf.select(config, "hydra.sweeper.direction", default=None)
    if isinstance(direction, list | tuple) or OmegaConf.is_list(direction):
        direction = direction[0] if len(direction) else None
    name = str(getattr(direction, "name", direction) or default).lower()
    if name not in ("maximize", "minimize"):
        raise ValueError(f"sweep direction must be maximize or minimize, got {name!r}")
    return name == "maximize"


def write_study_trials(config: DictConfig, sweep_dir: Path) -> int | None:
    """Dump every trial of the sweep's Optuna study to ``optuna_trials.csv``; return the count
    (``None``, writing nothing, for another sweeper)."""
    target = str(OmegaConf.select(config, "hydra.sweeper._target_", default="") or "")
    study_name = OmegaConf.select(config, "hydra.sweeper.study_name", default=None)
    if not target.endswith("OptunaStudySweeper") or not study_name:
        return None
    import optuna

    from transformer_mt.sweeps.study import storage_url
    from transformer_mt.training.pruning import open_storage

    storage = storage_url(OmegaConf.select(config, "hydra.sweeper.storage"), sweep_dir)
    study = optuna.load_study(study_name=study_name, storage=open_storage(storage))
    frame = study.trials_dataframe(
        attrs=("number", "value", "state", "params", "user_attrs", "datetime_start", "duration")
    )
    frame.to_csv(sweep_dir / "optuna_trials.csv", index=False)
    return len(frame)


def write_best_decoding(config: DictConfig, best: JobResult, sweep_dir: Path) -> Path | None:
    """For a decoding sweep (evaluate.py -m): the best job's ``decoding.*`` as a file that
    ``evaluate.py decoding_from=`` and ``transformer-mt-translate --decoding-from`` read."""
    if "ckpt_path" not in config or "decoding" not in config:
        return None
    chosen = dict(OmegaConf.to_container(config.decoding, resolve=True) or {})  # type: ignore[arg-type]
    for key, value in map(_split_override, best.overrides):
        if key.startswith("decoding."):
            chosen[key.removeprefix("decoding.")] = yaml_value(value)
    content = {
        "checkpoint": str(config.ckpt_path),
        "split": OmegaConf.select(config, "split"),
        best.metric or "value": best.value,
        "decoding": {k: v for k, v in chosen.items() if v is not None},
    }
    path = sweep_dir / "best_decoding.yaml"
    header = "# The best decoding of this sweep; use it with decoding_from=<this file>.\n"
    write_text_atomic(path, header + OmegaConf.to_yaml(content))
    log.info("best decoding: %s (%s)", content["decoding"], path)
    return path


def yaml_value(text: str) -> Any:
    """An override's value as YAML reads it (``5`` -> 5, ``0.6`` -> 0.6, ``null`` -> None)."""
    return OmegaConf.create(f"v: {text}").v if text else None


class SweepSummary(Callback):
    """Hydra callback: per-job ``sweep_result.json`` and a ranked sweep summary.

    Args:
        direction: ``"maximize"`` or ``"minimize"``, used when the sweeper does not say
            (Hydra's basic grid sweeper); Optuna's ``hydra.sweeper.direction`` wins.
    """

    def __init__(self, direction: str = "maximize") -> None:
        self.direction = direction

    @staticmethod
    def _is_multirun(config: DictConfig) -> bool:
        mode = OmegaConf.select(config, "hydra.mode", default=None)
        return mode == RunMode.MULTIRUN or str(mode) in ("MULTIRUN", "RunMode.MULTIRUN")

    def on_job_end(self, config: DictConfig, job_return: JobReturn, **kwargs: Any) -> None:
        """Record this job's result and refresh the sweep summary."""
        if not self._is_multirun(config):
            return
        try:
            result = job_result(config, job_return)
            run_dir = Path(result.run_dir or ".")
            run_dir.mkdir(parents=True, exist_ok=True)
            result.write(run_dir / RESULT_FILE)
            if result.status != "completed":
                log.error(
                    "sweep job %d %s: %s\n%s",
                    result.job,
                    result.status,
                    result.error,
                    result.traceback or "",
                )
            sweep_dir = Path(str(OmegaConf.select(config, "hydra.sweep.dir")))
            write_summary(sweep_dir, maximize=_maximize(config, self.direction))
        except Exception:  # bookkeeping must never take a sweep down
            log.exception("could not record the sweep result of this job")

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        """Write the final summary and log the best run."""
        sweep_dir = Path(str(OmegaConf.select(config, "hydra.sweep.dir")))
        results = write_summary(sweep_dir, maximize=_maximize(config, self.direction))
        try:
            n_trials = write_study_trials(config, sweep_dir)
        except Exception:  # e.g. an unreachable database: the summary is written already
            log.exception("could not write the Optuna study's trials")
        else:
            if n_trials is not None:
                log.info("the Optuna study now holds %d trials (optuna_trials.csv)", n_trials)
        if not results:
            log.warning("no sweep results found under %s", sweep_dir)
            return
        best = results[0]
        if best.value is None:
            log.warning("no run of the sweep produced %s; see %s", best.metric, sweep_dir)
            return
        write_best_decoding(config, best, sweep_dir)
        log.info(
            "sweep summary: %s (best %s=%.4f, job %d: %s)",
            sweep_dir / SUMMARY_MD,
            best.metric,
            best.value,
            best.job,
            " ".join(best.overrides),
        )
