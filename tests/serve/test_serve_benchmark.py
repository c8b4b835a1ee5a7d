"""``scripts/benchmark.py serve --quick`` against a real server process: sane JSON, no errors."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest
from test_serve_app import SOURCES, write_tiny_checkpoint

from transformer_mt.serve.timing import STAGES

from conftest import ROOT


@pytest.mark.slow
def test_serve_benchmark_quick(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))  # the script imports its package bench
    benchmark = importlib.import_module("benchmark")
    ckpt = write_tiny_checkpoint(tmp_path / "tiny.ckpt")
    source = tmp_path / "source.txt"
    source.write_text("\n".join(SOURCES[:20]) + "\n", encoding="utf-8")
    out = tmp_path / "serve.json"
    args = ["serve", "--quick", "--threads", "1", "--ckpt", str(ckpt), "--source", str(source)]
    result = benchmark.main([*args, "--out", str(out)])["serve"]
    assert json.loads(out.read_text()) == result
    assert result["sentences"] == 16  # --quick takes the first 16
    assert result["concurrent"]["errors"] == 0 and result["single"]["errors"] == 0
    assert result["concurrent"]["requests"] > 0 and result["single"]["requests"] == 5
    assert len(result["offline"]["seconds"]) == 2
    assert len(result["offline_in_client_batches"]["seconds"]) == 2
    # Every stage of a lone request is told by the server, and they add up to its total.
    stages = result["single"]["server_stages_ms"]
    assert list(stages) == ["total", *STAGES, "answer"]
    assert result["single"]["p50_ms"] > 0 and stages["engine"] > 0
    assert set(result["engine_stages_ms"]) == {"tokenise", "search", "detokenise"}
    assert result["environment"]["cpu"]
    assert {g["goal"] for g in result["goals"]} >= {"concurrent errors"}
