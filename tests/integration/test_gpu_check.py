"""scripts/gpu_check.sh and ``scripts/benchmark.py loop`` run on a machine without CUDA.

Without CUDA the GPU check still runs everything it can on the CPU and says, in its one table,
which parts were skipped and why. Both are slow (real training runs): ``make test-all``.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import ROOT


@pytest.mark.slow
def test_loop_benchmark_quick_rows_per_precision(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    benchmark = importlib.import_module("benchmark")
    out = tmp_path / "loop.json"
    result = benchmark.main(
        [
            "loop",
            "--quick",
            "--data",
            "generated",
            "--steps",
            "5",
            "--warmup",
            "1",
            "--repeats",
            "1",
            "--precisions",
            "32-true",
            "bf16-mixed",
            "--out",
            str(out),
        ]
    )["loop"]
    rows = {(r["contender"], r["precision"]): r for r in result["rows"]}
    assert set(rows) == {
        ("bare", "32-true"),
        ("real", "32-true"),
        ("bare", "bf16-mixed"),
        ("real", "bf16-mixed"),
        ("nn.Transformer", "32-true"),
    }
    assert all(r["tokens_per_s"] > 0 for r in rows.values())
    assert rows[("real", "32-true")]["vs_bare_same_precision"] > 0
    assert [g["target"] for g in result["goals"]] == [1.5, 1.3]
    assert out.is_file() and result["environment"]["cpu"]


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU fallback of the script")
def test_gpu_check_runs_on_a_cpu_and_says_what_it_skipped(tmp_path: Path) -> None:
    env = {**os.environ, "OUT_DIR": str(tmp_path), "PYTHON": sys.executable}
    done = subprocess.run(
        ["bash", str(ROOT / "scripts" / "gpu_check.sh")],
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    table = (tmp_path / "table.md").read_text()
    assert table == done.stdout
    lines = {
        line.split("|")[1].strip(): line for line in table.splitlines() if line.startswith("| ")
    }
    assert "skipped" in lines["gpu tests"] and "no CUDA device" in lines["gpu tests"]
    for part in ("bf16-mixed training", "training benchmark", "decoding benchmark"):
        assert "| passed |" in lines[part], lines[part]
    assert "tok/s" in lines["bf16-mixed training"]
    assert "real bf16-mixed" in lines["training benchmark"]
    assert "beam 5" in lines["decoding benchmark"]
