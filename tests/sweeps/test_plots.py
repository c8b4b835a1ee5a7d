"""Plots of a study: written at the end of a sweep and on demand from any stored study.

The studies are made here by hand (no training): four trials over two parameters, one of them
pruned, on a SQLite file and on Optuna's journal file.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import optuna
import pytest
from optuna.distributions import CategoricalDistribution, FloatDistribution
from optuna.trial import TrialState

from transformer_mt.sweeps import study as st
from transformer_mt.sweeps.plots import PLOTS, write_plots
from transformer_mt.training import pruning as tp

from conftest import ROOT

optuna.logging.set_verbosity(optuna.logging.WARNING)

SPACE = {
    "lr": FloatDistribution(1e-4, 1e-2, log=True),
    "dropout": CategoricalDistribution([0.1, 0.3]),
}
PNG = b"\x89PNG\r\n\x1a\n"


def fill(study: optuna.Study) -> None:
    """Three completed trials and one pruned at 40%, each reporting at 20/40/.../100%."""
    curves = {0: [10, 20, 30, 35, 38], 1: [12, 25, 33, 37, 40], 2: [5, 9], 3: [11, 22, 31, 36, 39]}
    for number, curve in curves.items():
        trial = study.ask(SPACE)
        for step, value in zip(range(20, 101, 20), curve):
            trial.report(float(value), step)
        if number == 2:
            study.tell(trial, state=TrialState.PRUNED)
        else:
            study.tell(trial, float(curve[-1]))


def assert_plots(folder: Path) -> None:
    for name in PLOTS:
        data = (folder / name).read_bytes()
        assert data.startswith(PNG), name
        assert len(data) > 10_000, name  # axes, labels and points, not an empty canvas


def test_a_study_gets_its_four_plots(tmp_path: Path) -> None:
    study = st.open_study(tp.open_storage(f"sqlite:///{tmp_path}/optuna.db"), "s", "maximize")
    fill(study)
    written = write_plots(study, tmp_path)
    assert sorted(p.name for p in written) == sorted(PLOTS)
    assert_plots(tmp_path)


def test_a_study_too_young_for_a_plot_skips_it_and_draws_the_rest(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Optuna would draw empty figures; they are skipped with the reason instead.

    One finished trial: no parameter importances yet (they need two), the others drawn. No
    finished trial, only a pruned one that reported: the intermediate values alone.
    """
    study = optuna.create_study(direction="maximize")
    trial = study.ask(SPACE)
    trial.report(3.0, 50)
    study.tell(trial, state=TrialState.PRUNED)
    (tmp_path / "pruned").mkdir()
    with caplog.at_level("INFO", logger="transformer_mt.sweeps.plots"):
        written = {p.name for p in write_plots(study, tmp_path / "pruned")}
    assert written == {"intermediate_values.png"}
    assert "optimization_history.png skipped: 0 completed trial(s)" in caplog.text
    trial = study.ask(SPACE)
    study.tell(trial, 4.0)
    with caplog.at_level("INFO", logger="transformer_mt.sweeps.plots"):
        written = {p.name for p in write_plots(study, tmp_path)}
    assert written == set(PLOTS) - {"param_importances.png"}
    assert "param_importances.png skipped: 1 completed trial(s); the plot needs 2" in caplog.text


def plots_script(*args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "scripts/study_plots.py", *args]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_the_script_plots_a_study_stored_in_a_journal_file(tmp_path: Path) -> None:
    url = f"journal:{tmp_path}/study.log"
    fill(st.open_study(tp.open_storage(url), "numbers", "maximize"))
    proc = plots_script(url, "numbers", "--out", str(tmp_path / "plots"))
    assert proc.returncode == 0, proc.stderr
    assert sorted(Path(line).name for line in proc.stdout.split()) == sorted(PLOTS)
    assert_plots(tmp_path / "plots")


def test_the_script_names_the_stored_studies_when_the_name_is_wrong(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/optuna.db"
    fill(st.open_study(tp.open_storage(url), "numbers", "maximize"))
    proc = plots_script(url, "nubmers", "--out", str(tmp_path / "plots"))
    assert proc.returncode == 2
    [line] = proc.stderr.splitlines()
    assert line.startswith("error: ") and "the storage holds: numbers" in line
    assert not (tmp_path / "plots").exists()  # nothing written for a study that is not there
