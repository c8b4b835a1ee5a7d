"""Sweep benchmark: what pruning and a second worker save on a study of the numbers task.

Four studies run one after the other, each a real ``python train.py -m
hparams_search=numbers_optuna`` (the trials train, validate and write checkpoints; by default
the trials of that search space as shipped: 2,000 sentences, 8 epochs of a 64-wide model, whose
validation BLEU spreads from ~1 to ~80 with the learning rate, so pruning has something to
judge):

* ``unpruned``: ``--trials`` trials (random sampler, seeded per trial number), no pruner;
* ``pruned``: the same trials (the same seed draws the same parameters for each trial number),
  with successive halving (rungs at the first validation and 3x later, one in three goes on);
* ``one worker``: ``--worker-trials`` trials, one process with one thread;
* ``two workers``: the same study size run by two processes (one thread each) on one storage.

Goals (issue 20): the pruned study takes <= 40% of the unpruned one's wall time and its best
``val/bleu`` is within 1 BLEU of the unpruned best; two workers take <= 60% of one worker's.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import Table, environment, goal

NAME = "sweep"
HELP = "pruned vs unpruned study, one vs two workers (numbers task, real trials)"
QUICK = {"trials": 2, "worker_trials": 2, "epochs": 2, "train_size": 300, "val_size": 20}

ROOT = Path(__file__).resolve().parents[2]
#: The search space whose trials the studies run.
SPACE_FILE = ROOT / "configs" / "hparams_search" / "numbers_optuna.yaml"


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Options of ``benchmark.py sweep``."""
    p.add_argument("--trials", type=int, default=16, help="trials of the pruning comparison")
    p.add_argument("--worker-trials", type=int, default=12, help="trials of the worker study")
    p.add_argument("--epochs", type=int, help="epochs (= validations) per trial (default: 8)")
    p.add_argument("--train-size", type=int, help="training sentences (default: 2,000)")
    p.add_argument("--val-size", type=int, help="validation sentences (default: 100)")
    p.add_argument("--seed", type=int, default=7, help="sampler seed")
    p.add_argument(
        "--part",
        choices=("all", "pruning", "workers"),
        default="all",
        help="the pruning comparison, the worker comparison, or both",
    )


def _command(args: argparse.Namespace, sweep_dir: Path, extra: list[str]) -> list[str]:
    return [
        sys.executable,
        "train.py",
        "-m",
        "hparams_search=numbers_optuna",
        *_sizes(args),
        "hydra.sweeper.sampler.name=random",
        f"hydra.sweeper.sampler.seed={args.seed}",
        "hydra.sweeper.plots=false",
        "threads=1",
        f"hydra.sweep.dir={sweep_dir}",
        *extra,
    ]


def _space_epochs() -> int:
    """Validations per trial of the search space as shipped (its trainer.max_epochs)."""
    from omegaconf import OmegaConf

    return int(OmegaConf.load(SPACE_FILE).trainer.max_epochs)


def _sizes(args: argparse.Namespace) -> list[str]:
    """Overrides of the search space's trial size, for the options given."""
    keys = {
        "train_size": "data.sizes.train",
        "val_size": "data.sizes.validation",
        "epochs": "trainer.max_epochs",
    }
    return [f"{key}={getattr(args, name)}" for name, key in keys.items() if getattr(args, name)]


def _study(args: argparse.Namespace, sweep_dir: Path, extra: list[str], workers: int) -> dict:
    """Run one study with ``workers`` processes; its wall time and its trials."""
    import optuna

    env = dict(os.environ, OMP_NUM_THREADS="1", WANDB_MODE="offline")
    sweep_dir.mkdir(parents=True)
    # Each worker writes its log to a file: a pipe read after the other worker's end would
    # fill up and stall the worker writing to it.
    logs = [sweep_dir / f"worker{i}.log" for i in range(workers)]
    start = time.perf_counter()
    procs = []
    for log in logs:
        with open(log, "w", encoding="utf-8") as handle:
            procs.append(
                subprocess.Popen(
                    _command(args, sweep_dir, extra),
                    cwd=ROOT,
                    env=env,
                    stdout=handle,
                    stderr=subprocess.STDOUT,
                )
            )
    codes = [proc.wait() for proc in procs]
    seconds = time.perf_counter() - start
    for code, log in zip(codes, logs):
        if code != 0:
            text = log.read_text(encoding="utf-8", errors="replace")
            raise RuntimeError(f"sweep failed ({code}):\n{text[-3000:]}")
    study = optuna.load_study(study_name="numbers", storage=f"sqlite:///{sweep_dir}/optuna.db")
    trials = [
        {"number": t.number, "state": t.state.name, "value": t.value, "params": t.params}
        for t in study.trials
    ]
    complete = [t["value"] for t in trials if t["state"] == "COMPLETE"]
    return {
        "seconds": seconds,
        "workers": workers,
        "trials": trials,
        "best": max(complete) if complete else None,
        "pruned": sum(t["state"] == "PRUNED" for t in trials),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Run the four studies; return settings, results, goals and the environment."""
    n, k = args.trials, args.worker_trials
    epochs = args.epochs or _space_epochs()
    sha = [
        "hydra.sweeper.pruner.name=successive_halving",
        # The first rung at the first validation, on the 5% grid trials report on.
        f"hydra.sweeper.pruner.min_resource={max(5 * (100 // epochs // 5), 5)}",
        "hydra.sweeper.pruner.reduction_factor=3",
    ]
    none = ["hydra.sweeper.pruner.name=none"]
    pruning, workers = args.part in ("all", "pruning"), args.part in ("all", "workers")
    studies, goals = {}, []
    with tempfile.TemporaryDirectory(prefix="bench-sweep-") as tmp:
        root = Path(tmp)
        if pruning:
            studies["unpruned"] = _study(
                args, root / "a", [f"hydra.sweeper.n_trials={n}", *none], 1
            )
            studies["pruned"] = _study(args, root / "b", [f"hydra.sweeper.n_trials={n}", *sha], 1)
        if workers:
            one = [f"hydra.sweeper.n_trials={k}", *none]
            studies["one worker"] = _study(args, root / "c", one, 1)
            studies["two workers"] = _study(args, root / "d", one, 2)
    if pruning:
        time_ratio = studies["pruned"]["seconds"] / studies["unpruned"]["seconds"]
        gap = (studies["unpruned"]["best"] or 0.0) - (studies["pruned"]["best"] or 0.0)
        goals += [
            goal("pruned / unpruned wall time", time_ratio, 0.40, higher_is_better=False),
            goal("unpruned best - pruned best val/bleu", gap, 1.0, higher_is_better=False),
        ]
    if workers:
        worker_ratio = studies["two workers"]["seconds"] / studies["one worker"]["seconds"]
        goals.append(
            goal("two workers / one worker wall time", worker_ratio, 0.60, higher_is_better=False)
        )
    settings = {
        k: v
        for k, v in vars(args).items()
        if k in ("trials", "worker_trials", "epochs", "val_size", "train_size", "seed", "part")
    }
    return {"settings": settings, "studies": studies, "goals": goals, "environment": environment()}


def tables(result: dict[str, Any]) -> list[Table]:
    """One row per study: trials, pruned, best val/bleu, wall time, ratio."""
    studies = result["studies"]
    base = {
        "unpruned": "unpruned",
        "pruned": "unpruned",
        "one worker": "one worker",
        "two workers": "one worker",
    }
    rows = []
    for name, study in studies.items():
        best = "-" if study["best"] is None else f"{study['best']:.2f}"
        ratio = study["seconds"] / studies[base[name]]["seconds"]
        rows.append(
            [
                name,
                str(study["workers"]),
                str(len(study["trials"])),
                str(study["pruned"]),
                best,
                f"{study['seconds']:.0f}",
                f"{ratio:.2f}x",
            ]
        )
    title = f"sweep studies on the numbers task ({result['environment']['cpu']})"
    header = ["study", "workers", "trials", "pruned", "best val/bleu", "wall s", "vs baseline"]
    return [(title, header, rows)]
