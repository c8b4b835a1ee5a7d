"""Every Optuna sweep the docs show is run as written, with zero trials: the sweeper checks its
search space, keys, settings and storage before any trial, so a documented override that
cannot work fails here (one did: ``hydra.sweeper.params.optimizer.lr=tag(...)``)."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT

#: Commands that need what a test cannot have (a PostgreSQL server on another host).
UNREACHABLE = ("postgresql",)


def documented_sweeps() -> list[tuple[str, str]]:
    """``(where, command)`` of each ``python train.py -m ... hparams_search=...`` in README.md
    and docs/, continuation lines joined."""
    found = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        lines = path.read_text(encoding="utf-8").splitlines()
        for number, line in enumerate(lines, start=1):
            if not line.startswith("python train.py -m "):
                continue
            command, i = line, number
            while command.rstrip().endswith("\\") and i < len(lines):
                command = command.rstrip()[:-1] + " " + lines[i].strip()
                i += 1
            command = command.split("  #")[0]
            if "hparams_search=" in command and not any(u in command for u in UNREACHABLE):
                found.append((f"{path.name}:{number}", command))
    return found


def test_the_docs_show_optuna_sweeps() -> None:
    assert len(documented_sweeps()) >= 5


def sweep_cases() -> list:
    """The README's first sweep in the default suite, every other one with the slow tests
    (each case is a start-up of train.py)."""
    return [
        pytest.param(where, command, marks=[pytest.mark.slow] if i else [])
        for i, (where, command) in enumerate(documented_sweeps())
    ]


@pytest.mark.parametrize("where, command", sweep_cases())
def test_a_documented_sweep_starts(where: str, command: str, tmp_path: Path) -> None:
    args = [
        a
        for a in shlex.split(command)[3:]
        if not a.startswith(("hydra.sweep.dir=", "hydra.sweeper.n_trials="))
    ]
    args += [f"hydra.sweep.dir={tmp_path / 'sweep'}", "hydra.sweeper.n_trials=0"]
    env = dict(os.environ, OMP_NUM_THREADS="1", WANDB_MODE="offline")
    proc = subprocess.run(
        [sys.executable, "train.py", "-m", *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, f"{where}: {command}\n{proc.stderr[-3000:]}"
    assert "error:" not in proc.stderr, f"{where}: {proc.stderr[-3000:]}"
