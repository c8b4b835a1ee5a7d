"""Replay a stored study under other pruners: what each would have saved, and what it kept.

A study run without a pruner (``hydra.sweeper.pruner.name=none``) still stores every trial's
``val/bleu`` at each validation (on the 5% grid of its budget). This script replays those
trials, in their order, through fresh in-memory studies with each candidate pruner (Optuna's
own pruners, configured as ``hydra.sweeper.pruner`` would configure them) and prints, per
pruner: trials pruned, the share of the trials' budget that would have been run, and the best
value among the trials that would have completed. Choosing a pruner this way costs no
training; choose on one study and measure the choice on another (``scripts/benchmark.py
sweep``), since a pruner picked and scored on the same trials is flattered by them.

Example::

    python train.py -m hparams_search=numbers_optuna hydra.sweeper.pruner.name=none \\
        hydra.sweeper.n_trials=16 hydra.sweep.dir=outputs/unpruned
    python scripts/replay_pruners.py outputs/unpruned --study numbers --validations 8
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

from transformer_mt.errors import UserError, guarded
from transformer_mt.training.pruning import grid_step, make_pruner

#: Pruners tried when --pruner is not given (hydra.sweeper.pruner settings).
CANDIDATES: list[dict[str, Any]] = [
    {"name": "median", "n_startup_trials": 2, "n_warmup_steps": 0},
    {"name": "median", "n_startup_trials": 2, "n_warmup_steps": 25},
    {"name": "median", "n_startup_trials": 4, "n_warmup_steps": 0},
    *[
        {"name": "successive_halving", "min_resource": r, "reduction_factor": f}
        for r in (10, 25)
        for f in (2, 3, 4)
    ],
    {"name": "hyperband", "min_resource": 10, "reduction_factor": 3},
]


def report_steps(validations: int) -> list[int]:
    """The grid steps at which a trial of ``validations`` evenly spaced validations reports."""
    return [grid_step(math.ceil(100 * k / validations)) for k in range(1, validations + 1)]


def load_trials(sweep: str, study_name: str) -> list[dict[str, Any]]:
    """The finished trials of a stored study, in trial order, with their intermediate values."""
    import optuna

    path = Path(sweep)
    url = f"sqlite:///{path / 'optuna.db'}" if path.is_dir() else sweep
    if path.is_dir() and not (path / "optuna.db").is_file():
        raise UserError(f"{path} holds no optuna.db; pass a sweep directory or a storage URL")
    try:
        study = optuna.load_study(study_name=study_name, storage=url)
    except KeyError as err:
        raise UserError(f"no study named {study_name!r} in {url}; pass --study") from err
    trials = []
    for t in sorted(study.trials, key=lambda t: t.number):
        if t.state.name != "COMPLETE" or not t.intermediate_values:
            continue
        trials.append({"number": t.number, "value": t.value, "curve": t.intermediate_values})
    if not trials:
        raise UserError(f"study {study_name!r} has no completed trial with intermediate values")
    pruned = [t.number for t in study.trials if t.state.name == "PRUNED"]
    if pruned:
        raise UserError(
            f"study {study_name!r} was run with a pruner (trials {pruned[:5]} pruned): "
            "replay needs every trial's whole curve; run it with hydra.sweeper.pruner.name=none"
        )
    return trials


def validations_of(curve: dict[int, float]) -> list[int]:
    """Where a curve was reported, not filled: the steps whose value differs from the step before.

    The trial side fills grid points between two validations with the earlier value; a
    validation that repeats the previous value exactly is taken for a fill (rare; pass
    --validations to give the cadence).
    """
    steps = sorted(curve)
    kept = [s for i, s in enumerate(steps) if i == 0 or curve[s] != curve[steps[i - 1]]]
    if steps[-1] not in kept:
        kept.append(steps[-1])
    return kept


def replay(trials: list[dict[str, Any]], pruner_cfg: dict[str, Any], validations: int | None):
    """One pruner over the trials, sequentially as one worker runs them."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="maximize", pruner=make_pruner(dict(pruner_cfg)))
    used, completed, pruned = 0, [], 0
    for t in trials:
        curve = t["curve"]
        steps = report_steps(validations) if validations else validations_of(curve)
        trial = study.ask()
        known, reached, stopped = None, 0, False
        for step in steps:
            if step not in curve:
                continue
            for between in sorted(s for s in curve if reached < s < step):
                if known is not None:
                    trial.report(known, between)
            trial.report(curve[step], step)
            known, reached = curve[step], step
            if trial.should_prune():
                stopped = True
                break
        if stopped:
            study.tell(trial, state=optuna.trial.TrialState.PRUNED)
            pruned += 1
            used += max(reached, 1)
        else:
            study.tell(trial, t["value"])
            completed.append(t["value"])
            used += 100
    return {
        "pruner": pruner_cfg,
        "pruned": pruned,
        "budget_share": used / (100 * len(trials)),
        "best": max(completed) if completed else None,
    }


def describe(cfg: dict[str, Any]) -> str:
    rest = ", ".join(f"{k}={v}" for k, v in cfg.items() if k != "name")
    return f"{cfg['name']} ({rest})" if rest else cfg["name"]


@guarded
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("sweep", help="a sweep directory (its optuna.db) or a storage URL")
    p.add_argument("--study", required=True, help="the study's name (hydra.sweeper.study_name)")
    p.add_argument(
        "--validations",
        type=int,
        help="validations per trial, evenly spaced (default: inferred from each curve)",
    )
    p.add_argument(
        "--pruner",
        action="append",
        type=json.loads,
        help='a pruner as JSON, e.g. \'{"name": "median", "n_startup_trials": 2}\' (repeatable)',
    )
    p.add_argument("--json", type=Path, help="also write the results here")
    args = p.parse_args(argv)
    trials = load_trials(args.sweep, args.study)
    unpruned_best = max(t["value"] for t in trials)
    rows = [replay(trials, cfg, args.validations) for cfg in args.pruner or CANDIDATES]
    print(f"{len(trials)} trials replayed; unpruned best {unpruned_best:.2f}")
    print("| pruner | pruned | budget run | best | best - unpruned best |")
    print("|---|---|---|---|---|")
    for r in rows:
        best = "-" if r["best"] is None else f"{r['best']:.2f}"
        gap = "-" if r["best"] is None else f"{r['best'] - unpruned_best:+.2f}"
        name = describe(r["pruner"])
        print(f"| {name} | {r['pruned']} | {r['budget_share']:.0%} | {best} | {gap} |")
    if args.json:
        result = {"trials": len(trials), "unpruned_best": unpruned_best, "rows": rows}
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
