"""scripts/replay_pruners.py: a stored unpruned study replayed under other pruners.

The studies are made here by hand (no training) on SQLite files, with the trial side's
reporting: a value at each validation, the grid points between two validations filled with
the earlier value.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from conftest import ROOT

optuna.logging.set_verbosity(optuna.logging.WARNING)

#: Four validations per trial: at 25, 50, 75 and 100% of the budget.
CURVES = {
    0: [10.0, 20.0, 30.0, 40.0],
    1: [1.0, 2.0, 3.0, 4.0],
    2: [12.0, 24.0, 36.0, 48.0],
    3: [0.5, 1.0, 1.5, 2.0],
}


@pytest.fixture
def replay(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    return importlib.import_module("replay_pruners")


def make_study(folder: Path, prune_trial: int | None = None) -> Path:
    folder.mkdir()
    study = optuna.create_study(
        study_name="s", storage=f"sqlite:///{folder / 'optuna.db'}", direction="maximize"
    )
    for number, curve in CURVES.items():
        trial = study.ask()
        previous = None
        for step, value in zip((25, 50, 75, 100), curve):
            if previous is not None:
                for between in range(previous[0] + 5, step, 5):
                    trial.report(previous[1], between)
            trial.report(value, step)
            previous = (step, value)
        if number == prune_trial:
            study.tell(trial, state=TrialState.PRUNED)
        else:
            study.tell(trial, curve[-1])
    return folder


def test_report_steps_follow_the_trial_side_grid(replay) -> None:
    # ceil(100 k / 8) on the 5% grid: what a trial with 8 validations reports.
    assert replay.report_steps(8) == [10, 25, 35, 50, 60, 75, 85, 100]
    assert replay.report_steps(4) == [25, 50, 75, 100]


def test_validations_are_inferred_from_the_filled_curve(replay) -> None:
    curve = {25: 1.0, 30: 1.0, 35: 1.0, 40: 1.0, 45: 1.0, 50: 2.0, 55: 2.0, 100: 2.0}
    assert replay.validations_of(curve) == [25, 50, 100]


def test_no_pruner_runs_everything_and_keeps_the_best(replay, tmp_path: Path) -> None:
    trials = replay.load_trials(str(make_study(tmp_path / "a")), "s")
    row = replay.replay(trials, {"name": "none"}, 4)
    assert (row["pruned"], row["budget_share"], row["best"]) == (0, 1.0, 48.0)


def test_a_median_pruner_stops_the_trials_behind_at_their_first_check(replay, tmp_path) -> None:
    trials = replay.load_trials(str(make_study(tmp_path / "a")), "s")
    cfg = {"name": "median", "n_startup_trials": 1, "n_warmup_steps": 0}
    row = replay.replay(trials, cfg, 4)
    # Trial 0 starts the median; 1 and 3 fall below it at 25%, 2 stays above to the end.
    assert row["pruned"] == 2
    assert row["budget_share"] == pytest.approx((100 + 25 + 100 + 25) / 400)
    assert row["best"] == 48.0
    # Inferring the validations from the curves gives the same replay.
    assert replay.replay(trials, cfg, None) == row


def test_the_command_prints_a_row_per_pruner_and_writes_json(replay, tmp_path, capsys) -> None:
    sweep = make_study(tmp_path / "a")
    out = tmp_path / "r.json"
    pruner = '{"name": "successive_halving", "min_resource": 25, "reduction_factor": 2}'
    code = replay.main([str(sweep), "--study", "s", "--pruner", pruner, "--json", str(out)])
    assert code == 0
    printed = capsys.readouterr().out
    assert "4 trials replayed; unpruned best 48.00" in printed
    assert "successive_halving (min_resource=25, reduction_factor=2)" in printed
    result = json.loads(out.read_text())
    assert result["unpruned_best"] == 48.0
    assert len(result["rows"]) == 1
    assert 0.25 <= result["rows"][0]["budget_share"] < 1.0


@pytest.mark.parametrize(
    ("make", "study", "message"),
    [
        (lambda p: make_study(p, prune_trial=1), "s", "was run with a pruner"),
        (lambda p: make_study(p), "other", "no study named 'other'"),
        (lambda p: (p.mkdir(), p)[1], "s", "holds no optuna.db"),
    ],
)
def test_bad_input_is_one_error_line(replay, tmp_path, capsys, make, study, message) -> None:
    sweep = make(tmp_path / "a")
    with pytest.raises(SystemExit) as exit_info:
        replay.main([str(sweep), "--study", study])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert err[0].startswith("error: ") and message in err[0]
