"""Hyperparameter sweeps: Hydra grid and Optuna multiruns with a summary per sweep.

The sweeps run ``python train.py -m ...`` in a subprocess (as a user would), on the
generated number task with a 32-wide model: a few seconds per job. The summary logic
itself is tested on hand-made results without training anything.
"""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra.core.utils import JobReturn, JobStatus
from omegaconf import OmegaConf

from transformer_mt.training.sweep import (
    RESULT_FILE,
    SUMMARY_CSV,
    SUMMARY_MD,
    JobResult,
    job_result,
    rank,
    summary_table,
    write_summary,
)

from conftest import ROOT

# One epoch of 300 pairs with a 32-wide model; no test pass, no checkpoint callback.
TINY = [
    "threads=1",
    "trainer.max_epochs=1",
    "trainer.enable_model_summary=false",
    "data.sizes.train=300",
    "data.sizes.validation=20",
    "data.sizes.test=20",
    "data.cache_dir=null",
    "model.d_model=32",
    "model.d_ff=64",
    "callbacks=none",
    "test_after_fit=false",
]


def run_sweep(sweep_dir: Path, *overrides: str, timeout: int = 120) -> subprocess.CompletedProcess:
    """``python train.py -m <overrides>`` into ``sweep_dir``; output kept for failure messages."""
    env = dict(os.environ, OMP_NUM_THREADS="1", WANDB_MODE="offline", HYDRA_FULL_ERROR="1")
    command = [sys.executable, "train.py", "-m", *TINY, *overrides, f"hydra.sweep.dir={sweep_dir}"]
    return subprocess.run(
        command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )


def read_summary(sweep_dir: Path) -> list[dict[str, str]]:
    with open(sweep_dir / SUMMARY_CSV, encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def _explain(proc: subprocess.CompletedProcess) -> str:
    return f"rc={proc.returncode}\n--- stdout\n{proc.stdout[-3000:]}\n--- stderr\n{proc.stderr[-5000:]}"


# --------------------------------------------------------------------- summary logic


def _result(job: int, value: float | None, status: str = "completed", **over: str) -> JobResult:
    overrides = [f"{k.replace('__', '.')}={v}" for k, v in over.items()]
    return JobResult(job=job, status=status, metric="val/bleu", value=value, overrides=overrides)


def test_rank_puts_best_first_and_failures_last() -> None:
    results = [_result(0, 1.0), _result(1, None, "failed"), _result(2, 3.0), _result(3, 2.0)]
    assert [r.job for r in rank(results)] == [2, 3, 0, 1]
    assert [r.job for r in rank(results, maximize=False)] == [0, 3, 2, 1]


def test_summary_table_has_one_column_per_varying_override() -> None:
    results = [
        _result(0, 2.0, seed="1", model__dropout="0.1", optimizer__lr="1e-3"),
        _result(1, 1.0, seed="1", model__dropout="0.3", optimizer__lr="1e-3"),
        _result(2, 0.5, seed="1", model__dropout="0.3", optimizer__lr="3e-4"),
    ]
    header, rows, shared = summary_table(results)
    assert header[:4] == ["rank", "job", "model.dropout", "optimizer.lr"]
    assert "val/bleu" in header
    assert shared == ["seed=1"]
    assert rows[1][2:4] == ["0.3", "1e-3"]


def test_job_result_records_the_exception_of_a_failed_job() -> None:
    config = OmegaConf.create(
        {"optimized_metric": "val/bleu", "hydra": {"job": {"num": 3}, "runtime": {}}}
    )
    try:
        raise ValueError("model.d_model=32 is not divisible by model.n_heads=3")
    except ValueError as err:
        failed = JobReturn(overrides=["model.n_heads=3"], status=JobStatus.FAILED)
        failed.return_value = err
    result = job_result(config, failed)
    assert (result.job, result.status, result.value) == (3, "failed", None)
    assert result.error == "ValueError: model.d_model=32 is not divisible by model.n_heads=3"
    assert "Traceback" in (result.traceback or "")

    none = JobReturn(overrides=[], status=JobStatus.COMPLETED, _return_value=None)
    assert job_result(config, none).status == "no_metric"


def test_write_summary_reads_every_job(tmp_path: Path) -> None:
    for job, value in ((0, 1.5), (1, 4.0)):
        (tmp_path / str(job)).mkdir()
        _result(job, value, model__dropout=str(job)).write(tmp_path / str(job) / RESULT_FILE)
    ranked = write_summary(tmp_path)
    assert [r.job for r in ranked] == [1, 0]
    rows = read_summary(tmp_path)
    assert [(row["rank"], row["job"], row["val/bleu"]) for row in rows] == [
        ("1", "1", "4.0000"),
        ("2", "0", "1.5000"),
    ]
    assert "| 1 | 1 | 1 | 4.0000 | completed |" in (tmp_path / SUMMARY_MD).read_text()


# -------------------------------------------------------------------------- sweeps


def test_grid_sweep_writes_a_ranked_summary(tmp_path: Path) -> None:
    """Two grid runs, each in its numbered directory, and one summary ranking them."""
    sweep_dir = tmp_path / "grid"
    proc = run_sweep(sweep_dir, "model.n_heads=2", "model.dropout=0.0,0.2")
    assert proc.returncode == 0, _explain(proc)
    for job in ("0", "1"):
        assert (sweep_dir / job / RESULT_FILE).is_file()
        assert (sweep_dir / job / "checkpoints" / "last.ckpt").is_file()
    rows = read_summary(sweep_dir)
    assert sorted(row["model.dropout"] for row in rows) == ["0.0", "0.2"]
    assert all(row["status"] == "completed" and row["val/bleu"] != "" for row in rows)
    values = [float(row["val/bleu"]) for row in rows]
    assert values == sorted(values, reverse=True)
    assert "Shared overrides" in (sweep_dir / SUMMARY_MD).read_text()


@pytest.mark.slow
def test_optuna_sweep_records_a_failed_trial_and_goes_on(tmp_path: Path) -> None:
    """An invalid trial (32 % 3 != 0) is a failed trial with its reason; the study finishes.

    The seeded TPE sampler (random for its first trials) draws n_heads=3, then 2.
    """
    sweep_dir = tmp_path / "optuna"
    proc = run_sweep(
        sweep_dir,
        "hparams_search=numbers_optuna",
        "hydra.sweeper.sampler.seed=42",
        "hydra.sweeper.n_trials=2",
        "hydra.sweeper.params=null",
        "model.n_heads=choice(2,3)",
    )
    assert proc.returncode == 0, _explain(proc)
    rows = {row["model.n_heads"]: row for row in read_summary(sweep_dir)}
    assert set(rows) == {"2", "3"}
    assert rows["2"]["status"] == "completed" and rows["2"]["rank"] == "1"
    assert rows["3"]["status"] == "failed"
    assert "not divisible by model.n_heads=3" in rows["3"]["error"]
    assert (sweep_dir / "optimization_results.yaml").is_file()


@pytest.mark.slow
def test_optuna_study_in_sqlite_resumes(tmp_path: Path) -> None:
    """Two invocations of a 2-trial study on one SQLite storage leave 4 trials, not 2."""
    import optuna

    storage = f"sqlite:///{tmp_path / 'optuna.db'}"
    common = [
        "hparams_search=numbers_optuna",
        "model.n_heads=2",
        "hydra.sweeper.n_trials=2",
        f"hydra.sweeper.storage={storage}",
        "hydra.sweeper.study_name=resume_test",
    ]
    first = run_sweep(tmp_path / "first", *common)
    assert first.returncode == 0, _explain(first)
    second = run_sweep(tmp_path / "second", *common)
    assert second.returncode == 0, _explain(second)

    study = optuna.load_study(study_name="resume_test", storage=storage)
    assert [t.number for t in study.trials] == [0, 1, 2, 3]
    assert all(t.state == optuna.trial.TrialState.COMPLETE for t in study.trials)
    # Each invocation summarises its own jobs; optuna_trials.csv lists the whole study.
    assert len(read_summary(tmp_path / "second")) == 2
    with open(tmp_path / "second" / "optuna_trials.csv", encoding="utf-8") as handle:
        assert len(list(csv.DictReader(handle))) == 4


def test_a_job_failed_on_a_user_error_is_recorded_as_its_one_line() -> None:
    from transformer_mt.cli import JobFailed

    config = OmegaConf.create({"hydra": {"job": {"num": 0}, "runtime": {"output_dir": "x"}}})
    failed = JobReturn(overrides=["model.n_heads=3"], status=JobStatus.FAILED)
    failed.return_value = JobFailed("error: job #0 (model.n_heads=3): not divisible; fix", 2)
    result = job_result(config, failed)
    assert (result.status, result.error, result.traceback) == (
        "failed",
        "error: job #0 (model.n_heads=3): not divisible; fix",
        None,
    )
