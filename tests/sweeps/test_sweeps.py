"""Hyperparameter sweeps: Hydra grid and Optuna multiruns with a summary per sweep.

The sweeps run ``python train.py -m ...`` in a subprocess (as a user would), on the
generated number task with a 32-wide model: a few seconds per job. The summary logic
itself is tested on hand-made results without training anything.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
from hydra.core.utils import JobReturn, JobStatus
from omegaconf import OmegaConf

from transformer_mt.sweeps import host
from transformer_mt.sweeps.summary import (
    RESULT_FILE,
    SUMMARY_CSV,
    SUMMARY_MD,
    JobResult,
    job_result,
    rank,
    summary_table,
    write_summary,
)

from conftest import ROOT, TESTS

# One epoch of 300 pairs with a 32-wide 1+1-layer model; no test pass, no checkpoint callback.
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
    "model.n_encoder_layers=1",
    "model.n_decoder_layers=1",
    "callbacks=none",
    "test_after_fit=false",
]


def run_sweep(
    sweep_dir: Path, *overrides: str, timeout: int = 900, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """``python train.py -m <overrides>`` into ``sweep_dir``; output kept for failure messages.

    The timeout only guards against a hung sweep: a busy shared machine runs even tiny sweeps
    for minutes.
    """
    env = dict(os.environ, OMP_NUM_THREADS="1", WANDB_MODE="offline", **(env or {}))
    command = [sys.executable, "train.py", "-m", *TINY, *overrides, f"hydra.sweep.dir={sweep_dir}"]
    return subprocess.run(
        command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )


def read_summary(sweep_dir: Path) -> list[dict[str, str]]:
    with open(sweep_dir / SUMMARY_CSV, encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def _explain(proc: subprocess.CompletedProcess) -> str:
    out, err = proc.stdout[-3000:], proc.stderr[-5000:]
    return f"rc={proc.returncode}\n--- stdout\n{out}\n--- stderr\n{err}"


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


# ----------------------------------------------------------------------- Optuna studies

#: Numbers search at test size: 4 validations (25/50/75/100% of the budget) of a few steps each.
OPTUNA = [
    "hparams_search=numbers_optuna",
    "trainer.max_epochs=4",
    "hydra.sweeper.heartbeat_interval=1",
]


def _study(sweep_dir: Path, name: str = "numbers") -> Any:
    import optuna

    return optuna.load_study(study_name=name, storage=f"sqlite:///{sweep_dir / 'optuna.db'}")


def test_optuna_sweep_prunes_a_trial_below_the_median_and_records_it(tmp_path: Path) -> None:
    """A study of 3 trials with the median pruner, on val/loss (minimised).

    With seed 3 the per-trial draws are lr 3e-3, 1e-7, 3e-3: trial 1 barely learns, falls
    behind trial 0 at its first validation (25% of its budget) and stops there.
    """
    sweep_dir = tmp_path / "optuna"
    proc = run_sweep(
        sweep_dir,
        *OPTUNA,
        "hydra.sweeper.sampler.seed=3",
        "hydra.sweeper.n_trials=3",
        "hydra.sweeper.params=null",
        "optimizer.lr=choice(3e-3,1e-7)",
        "optimized_metric=val/loss",
        "hydra.sweeper.direction=minimize",
        "hydra.sweeper.pruner.n_startup_trials=1",
        "hydra.sweeper.pruner.n_warmup_steps=0",
    )
    assert proc.returncode == 0, _explain(proc)
    study = _study(sweep_dir)
    lrs = [t.params["optimizer.lr"] for t in study.trials]
    assert lrs == [3e-3, 1e-7, 3e-3]
    states = [t.state.name for t in study.trials]
    assert states == ["COMPLETE", "PRUNED", "COMPLETE"]
    assert study.trials[1].user_attrs["pruned_at"] == 25
    # The machine's speed, measured before each trial against the study's first measurement.
    reference = study.user_attrs["host_reference"]
    assert reference["gflops"] > 0 and reference["cpu"] == host.cpu_model()
    speeds = [t.user_attrs["host"] for t in study.trials]
    assert speeds[0]["ratio"] == 1.0 and all(s["gflops"] > 0 and s["ratio"] > 0 for s in speeds)
    assert all(s["waited_s"] == 0 for s in speeds)  # no host_check.min_ratio: never waits
    assert study.trials[1].value == study.trials[1].intermediate_values[25]  # what it reached
    rows = {row["trial"]: row for row in read_summary(sweep_dir)}
    assert [rows[n]["state"] for n in ("0", "1", "2")] == states
    assert rows["1"]["status"] == "pruned" and rows["1"]["rank"] == "3"  # after the completed
    assert rows["1"]["optimizer.lr"] == "1e-07"
    # The pruned trial kept its checkpoint; every trial runs in <sweep dir>/<trial number>.
    assert list((sweep_dir / "1" / "checkpoints").glob("best-*.ckpt"))
    assert "optimizer.lr" in (sweep_dir / "optimization_results.yaml").read_text()
    assert (sweep_dir / "multirun.yaml").is_file()
    assert (sweep_dir / "intermediate_values.png").stat().st_size > 10_000
    summary = (sweep_dir / SUMMARY_MD).read_text()
    assert "3 runs, 2 completed, 1 pruned" in summary
    assert "alembic" not in proc.stdout + proc.stderr  # no plugin noise


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["optimizer.lrr=choice(1e-3,2e-3)"], r"search space: unknown parameter 'optimizer\.lrr'"),
        # The first case holds the rule in the default suite; each further one costs a
        # start-up of train.py, so they run with the slow tests.
        pytest.param(
            ["optimizer.lr=interval(1e-2,1e-4)"], r"need low < high", marks=pytest.mark.slow
        ),
        pytest.param(
            ["hydra.sweeper.storage=postgresql+psycopg://nobody@127.0.0.1:9/none"],
            "cannot open",
            marks=pytest.mark.slow,
        ),
        pytest.param(
            ["hydra.sweeper.enqueue=[{model.dropout:0.5}]"],
            r"model\.dropout=0\.5 is outside",
            marks=pytest.mark.slow,
        ),
        pytest.param(
            ["hydra.sweeper.host_check.min_ratio=1.5"],
            r"host_check\.min_ratio must be within \[0, 1\]",
            marks=pytest.mark.slow,
        ),
    ],
)
def test_bad_sweep_input_is_one_error_line_before_any_trial(
    tmp_path: Path, overrides: list[str], message: str
) -> None:
    sweep_dir = tmp_path / "bad"
    proc = run_sweep(sweep_dir, *OPTUNA, *overrides)
    assert proc.returncode == 2, _explain(proc)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and __import__("re").search(message, errors[0]), proc.stderr
    assert "Traceback" not in proc.stderr
    assert not list(sweep_dir.glob("*/sweep_result.json"))  # no trial ran


@pytest.mark.slow  # whole sweeps in subprocesses: the grid and pruning tests hold the path
def test_a_worker_stops_when_trial_after_trial_fails(tmp_path: Path) -> None:
    """Every draw is invalid (32 % 3 != 0): two failures in a row end the worker, exit 1."""
    proc = run_sweep(
        tmp_path,
        *OPTUNA,
        "hydra.sweeper.params=null",
        "model.n_heads=choice(3,6)",
        "hydra.sweeper.max_failures_in_a_row=2",
    )
    assert proc.returncode == 1, _explain(proc)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert errors[-1].startswith("error: 2 trials in a row failed, the last with: ")
    assert "max_failures_in_a_row=2" in errors[-1]
    assert [t.state.name for t in _study(tmp_path).trials] == ["FAIL", "FAIL"]


@pytest.mark.slow  # whole sweeps in subprocesses: the grid and pruning tests hold the path
def test_trials_that_end_before_their_first_validation_stop_the_sweep(tmp_path: Path) -> None:
    """No metric is a failure toward the stop rule: the sweep ends by itself, saying why (it
    ran 271 replacement trials in 500 s and went on). A step budget ends with a validation, so
    these trials validate every 5th epoch and end within the first."""
    proc = run_sweep(
        tmp_path, *OPTUNA, "trainer.max_steps=2", "trainer.check_val_every_n_epoch=5",
        "hydra.sweeper.n_trials=2", "hydra.sweeper.max_failures_in_a_row=2",
    )  # fmt: skip
    assert proc.returncode == 1, _explain(proc)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert "no value of the optimized metric" in errors[-1], errors
    assert "trainer.check_val_every_n_epoch" in errors[-1]
    assert [t.state.name for t in _study(tmp_path).trials] == ["FAIL", "FAIL"]


@pytest.mark.slow  # whole sweeps in subprocesses: the grid and pruning tests hold the path
def test_a_study_reused_with_another_space_is_refused_leaving_no_running_trial(
    tmp_path: Path,
) -> None:
    import optuna
    from optuna.distributions import FloatDistribution

    study = optuna.create_study(
        study_name="numbers", storage=f"sqlite:///{tmp_path / 'optuna.db'}", direction="maximize"
    )
    study.add_trial(
        optuna.trial.create_trial(
            params={"model.dropout": 0.15},
            distributions={"model.dropout": FloatDistribution(0.0, 0.3)},
            value=1.0,
        )
    )
    proc = run_sweep(tmp_path, *OPTUNA)  # numbers_optuna searches model.dropout as a choice
    assert proc.returncode == 2, _explain(proc)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "searched model.dropout as" in errors[0], proc.stderr
    assert [t.state.name for t in _study(tmp_path).trials] == ["COMPLETE"]


@pytest.mark.slow  # whole sweeps in subprocesses: the grid and pruning tests hold the path
def test_a_study_of_the_other_direction_or_an_unwritable_sweep_dir_is_refused(
    tmp_path: Path,
) -> None:
    import optuna

    optuna.create_study(study_name="numbers", storage=f"sqlite:///{tmp_path / 'optuna.db'}")
    proc = run_sweep(tmp_path, *OPTUNA)  # the stored study minimises, the search maximises
    assert proc.returncode == 2, _explain(proc)
    assert "already exists with direction minimize, not maximize" in proc.stderr
    blocked = tmp_path / "file"
    blocked.write_text("")
    proc = run_sweep(blocked / "sweep", *OPTUNA)
    assert proc.returncode == 2, _explain(proc)
    assert "error: cannot write the sweep directory" in proc.stderr


@pytest.mark.slow
def test_optuna_sweep_records_a_failed_trial_and_goes_on(tmp_path: Path) -> None:
    """An invalid trial (32 % 3 != 0) is a failed trial with its reason; the study finishes.

    With seed 10 the per-trial draws are n_heads 3, 2, 2: trial 0 fails and, since a failed
    trial does not count, trials 1 and 2 make the 2 the study asks for.
    """
    sweep_dir = tmp_path / "optuna"
    proc = run_sweep(
        sweep_dir,
        *OPTUNA,
        "hydra.sweeper.n_trials=2",
        "hydra.sweeper.params=null",
        "hydra.sweeper.sampler.seed=10",
        "model.n_heads=choice(2,3)",
    )
    assert proc.returncode == 0, _explain(proc)
    trials = _study(sweep_dir).trials
    assert [t.params["model.n_heads"] for t in trials] == [3, 2, 2]
    assert [t.state.name for t in trials] == ["FAIL", "COMPLETE", "COMPLETE"]
    rows = {row["trial"]: row for row in read_summary(sweep_dir)}
    assert [rows[n]["state"] for n in ("0", "1", "2")] == ["FAIL", "COMPLETE", "COMPLETE"]
    assert rows["0"]["status"] == "failed" and rows["0"]["rank"] == "-"
    assert "not divisible by model.n_heads=3" in rows["0"]["error"]


@pytest.mark.slow
def test_a_resumed_study_continues_without_repeating_a_trial(tmp_path: Path) -> None:
    """The same command twice on one sweep dir: 2 trials, then 2 more, all parameters new;
    the given point (``enqueue``) is the first trial and is not run again on resuming."""
    given = "hydra.sweeper.enqueue=[{optimizer.lr:0.002,model.dropout:0.2}]"
    first = run_sweep(tmp_path, *OPTUNA, "hydra.sweeper.n_trials=2", given)
    assert first.returncode == 0, _explain(first)
    second = run_sweep(tmp_path, *OPTUNA, "hydra.sweeper.n_trials=4", given)
    assert second.returncode == 0, _explain(second)
    trials = _study(tmp_path).trials
    assert [t.number for t in trials] == [0, 1, 2, 3]
    assert trials[0].params == {"optimizer.lr": 0.002, "model.dropout": 0.2}
    assert all(t.state.name in ("COMPLETE", "PRUNED") for t in trials)
    assert len({tuple(sorted(t.params.items())) for t in trials}) == 4
    with open(tmp_path / "optuna_trials.csv", encoding="utf-8") as handle:
        assert len(list(csv.DictReader(handle))) == 4
    assert sorted(row["trial"] for row in read_summary(tmp_path)) == ["0", "1", "2", "3"]


@pytest.mark.slow  # whole sweeps in subprocesses: the grid and pruning tests hold the path
def test_a_two_stage_study_in_a_journal_file_confirms_its_best_trial_once(tmp_path: Path) -> None:
    """2 trials of 2 epochs in Optuna's journal file, then the best one again at 3 epochs.

    Running the command again on the full study starts nothing: the confirmation is claimed.
    """
    journal = tmp_path / "study.log"
    two_stage = [
        *OPTUNA,
        "trainer.max_epochs=2",
        "hydra.sweeper.n_trials=2",
        f"hydra.sweeper.storage=journal:{journal}",
        "hydra.sweeper.confirm.top_k=1",
        "hydra.sweeper.confirm.overrides=['trainer.max_epochs=3']",
    ]
    first = run_sweep(tmp_path / "sweep", *two_stage)
    assert first.returncode == 0, _explain(first)
    assert journal.is_file() and not (tmp_path / "sweep" / "optuna.db").exists()
    assert "a journal file keeps no heartbeats" in first.stdout + first.stderr
    import optuna

    storage = optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(str(journal))
    )
    study = optuna.load_study(study_name="numbers", storage=storage)
    assert len(study.trials) == 2
    best = study.best_trial
    confirm_dir = tmp_path / "sweep" / f"confirm_{best.number}"
    config = OmegaConf.load(confirm_dir / ".hydra" / "config.yaml")
    assert config.trainer.max_epochs == 3  # the full budget ...
    for key, value in best.params.items():  # ... with the best trial's parameters
        assert OmegaConf.select(config, key) == pytest.approx(value)
    confirmed = json.loads((confirm_dir / RESULT_FILE).read_text())
    assert study.user_attrs[f"confirm_{best.number}"] == confirmed["value"]
    assert set(study.user_attrs) == {
        f"confirm_{best.number}",
        f"confirm_{best.number}_host",
        "host_reference",
    }
    rows = read_summary(tmp_path / "sweep")
    assert sorted(row["state"] for row in rows) == ["COMPLETE", "COMPLETE", "CONFIRM"]

    again = run_sweep(tmp_path / "sweep", *two_stage)
    assert again.returncode == 0, _explain(again)
    assert "confirming trial" not in again.stdout + again.stderr
    assert f"trial {best.number} is confirmed by another worker" in again.stdout + again.stderr
    assert len(optuna.load_study(study_name="numbers", storage=storage).trials) == 2


def start_worker(sweep_dir: Path, *overrides: str) -> subprocess.Popen:
    """One more worker of the study in ``sweep_dir`` (the same command as the others)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", WANDB_MODE="offline", HYDRA_FULL_ERROR="1")
    # The test-only fault callback (tests/faults.py) is importable by its module name.
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")]))
    command = [sys.executable, "train.py", "-m", *TINY, *OPTUNA, *overrides]
    command.append(f"hydra.sweep.dir={sweep_dir}")
    return subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


@pytest.mark.slow
def test_two_workers_on_one_storage_share_a_study(tmp_path: Path) -> None:
    """Two worker processes run a 6-trial study together: each trial once, 6 in all."""
    workers = [start_worker(tmp_path, "hydra.sweeper.n_trials=6") for _ in range(2)]
    outputs = [worker.communicate(timeout=600) for worker in workers]
    for worker, (out, err) in zip(workers, outputs):
        assert worker.returncode == 0, f"{out[-2000:]}\n{err[-4000:]}"
    trials = _study(tmp_path).trials
    finished = [t for t in trials if t.state.name in ("COMPLETE", "PRUNED")]
    assert len(finished) == 6
    # A trial asked by both workers at once for the last place is given up, never run twice.
    assert all(t.user_attrs.get("surplus") for t in trials if t not in finished)
    assert len({tuple(sorted(t.params.items())) for t in finished}) == 6  # distinct draws
    # Every finished trial ran in its own directory, by one worker, and the summary has it.
    rows = read_summary(tmp_path)
    assert sorted(int(r["trial"]) for r in rows) == sorted(t.number for t in finished)
    logs = [out + err for out, err in outputs]
    for trial in finished:
        assert sum(log.count(f"] trial {trial.number}: ") for log in logs) == 1  # launched once


@pytest.mark.slow
def test_a_worker_killed_mid_trial_leaves_the_study_to_the_other(tmp_path: Path) -> None:
    """kill -9 at step 2 of worker A's first trial: its heartbeat stops, worker B fails that
    trial, runs its parameters again (max_retry=1) and finishes the study."""
    fault = [
        "+callbacks.fault._target_=faults.FaultInjection",
        "+callbacks.fault.fault=SIGKILL",
        "+callbacks.fault.at_step=2",
    ]
    common = ["hydra.sweeper.n_trials=3", "hydra.sweeper.max_retry=1"]
    killed = start_worker(tmp_path, *common, *fault)
    killed.communicate(timeout=300)
    assert killed.returncode == -9
    survivor = start_worker(tmp_path, *common)
    out, err = survivor.communicate(timeout=600)
    assert survivor.returncode == 0, f"{out[-2000:]}\n{err[-4000:]}"
    trials = _study(tmp_path).trials
    assert trials[0].state.name == "FAIL"  # the killed trial, failed by heartbeat
    finished = [t for t in trials if t.state.name in ("COMPLETE", "PRUNED")]
    assert len(finished) == 3
    retried = [t for t in finished if t.system_attrs.get("failed_trial") == 0]
    assert len(retried) == 1 and retried[0].params == trials[0].params


class RankRecorder(pl.Callback):
    """Write ``rank{r}.json`` into ``out_dir``: the world, the lr trained with, the last step."""

    def __init__(self, out_dir: str) -> None:
        self.out_dir = Path(out_dir)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        record = {
            "world_size": trainer.world_size,
            "lr": trainer.optimizers[0].defaults["lr"],
            "global_step": trainer.global_step,
        }
        self.out_dir.mkdir(parents=True, exist_ok=True)
        (self.out_dir / f"rank{trainer.global_rank}.json").write_text(json.dumps(record))


@pytest.mark.slow
def test_a_ddp_trial_trains_the_same_parameters_on_every_rank_and_stops_together(
    tmp_path: Path,
) -> None:
    """trainer=ddp with 2 gloo processes per trial: one process asks the study, both ranks
    train the trial's parameters, rank 0 reports, and the pruned trial stops on both ranks at
    the same step (the draws and the pruning are those of the single-process test above)."""
    here = Path(__file__).resolve().parent  # test_sweeps.RankRecorder and the conftest it needs
    env = {"PYTHONPATH": os.pathsep.join([str(here), str(here.parent)])}
    proc = run_sweep(
        tmp_path,
        *OPTUNA,
        "trainer=ddp",
        "trainer.accelerator=cpu",
        "trainer.devices=2",
        "hydra.sweeper.sampler.seed=3",
        "hydra.sweeper.n_trials=2",
        "hydra.sweeper.params=null",
        "optimizer.lr=choice(3e-3,1e-7)",
        "optimized_metric=val/loss",
        "hydra.sweeper.direction=minimize",
        "hydra.sweeper.pruner.n_startup_trials=1",
        "hydra.sweeper.pruner.n_warmup_steps=0",
        "+callbacks.recorder._target_=test_sweeps.RankRecorder",
        "+callbacks.recorder.out_dir=${run_dir}/ranks",
        env=env,
    )
    assert proc.returncode == 0, _explain(proc)
    trials = _study(tmp_path).trials
    assert [t.state.name for t in trials] == ["COMPLETE", "PRUNED"]
    steps = []
    for trial in trials:
        ranks = [
            json.loads((tmp_path / str(trial.number) / "ranks" / f"rank{r}.json").read_text())
            for r in (0, 1)
        ]
        assert [r["world_size"] for r in ranks] == [2, 2]
        assert [r["lr"] for r in ranks] == [trial.params["optimizer.lr"]] * 2
        assert ranks[0]["global_step"] == ranks[1]["global_step"]  # stopped together
        steps.append(ranks[0]["global_step"])
    assert steps[1] < steps[0]  # the pruned trial stopped early, on both ranks
    # Only the trial's job asked the study: no rank ran a sweep of its own.
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.isdigit()) == ["0", "1"]


def test_a_job_failed_on_a_user_error_is_recorded_as_its_one_line() -> None:
    from transformer_mt.errors import JobFailed

    config = OmegaConf.create({"hydra": {"job": {"num": 0}, "runtime": {"output_dir": "x"}}})
    failed = JobReturn(overrides=["model.n_heads=3"], status=JobStatus.FAILED)
    failed.return_value = JobFailed("error: job #0 (model.n_heads=3): not divisible; fix", 2)
    result = job_result(config, failed)
    assert (result.status, result.error, result.traceback) == (
        "failed",
        "error: job #0 (model.n_heads=3): not divisible; fix",
        None,
    )
