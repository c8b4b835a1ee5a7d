"""Smoke tests of ``scripts/benchmark.py``: its subcommands in ``--quick`` mode write sane JSON.

The ``loop`` benchmark is tested in test_gpu_check.py, ``data-memory`` in test_large_corpus.py.
"""

from __future__ import annotations

import importlib
import json
import math
from pathlib import Path

import pytest

from transformer_mt.errors import EXIT_USER_ERROR, guarded

from conftest import ROOT, best_checkpoint

SCRIPTS = ROOT / "scripts"


def _positive(value: float) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value) and value > 0


@pytest.fixture
def benchmark(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.syspath_prepend(str(SCRIPTS))  # the script imports its sibling package bench
    return importlib.import_module("benchmark")


def test_all_subcommands_quick(benchmark, tmp_path: Path) -> None:
    results = benchmark.main(
        ["all", "--quick", "--threads", "1", "--out", str(tmp_path), "--plot", "--profile"]
    )
    assert set(results) == {"attention", "train", "decode", "dropout"}
    on_disk = {name: json.loads((tmp_path / f"{name}.json").read_text()) for name in results}

    attention = on_disk["attention"]
    assert attention["settings"]["quick"] is True
    for row in attention["rows"]:
        for name in ("ours_fused", "ours_explicit", "nn.MultiheadAttention"):
            assert _positive(row[name]["median_ms"])
            assert _positive(row[name]["saved_bytes"])
    # The explicit path saves the (B, H, L, L) weights; the fused kernel does not.
    last = attention["rows"][-1]
    assert last["ours_explicit"]["saved_bytes"] > last["ours_fused"]["saved_bytes"]
    assert _positive(attention["typical"]["fused_vs_torch_time"])
    assert (tmp_path / "attention.png").is_file()

    train = on_disk["train"]
    for name in ("ours", "nn.Transformer"):
        model = train["models"][name]
        assert _positive(model["target_tokens_per_s"])
        assert 0 < model["mfu"] < 10
    # Same embeddings, stacks and tied generator: the same parameter count.
    assert train["models"]["ours"]["parameters"] == train["models"]["nn.Transformer"]["parameters"]
    assert _positive(train["flops"]["total_flops"]) and "formula" in train["flops"]
    assert _positive(train["matmul_peak"]["used_flops_per_s"])
    assert 0 <= train["profile"]["ours"]["matmul_pct"] <= 100 and train["profile"]["ours"]["top"]

    decode = on_disk["decode"]
    n_new = decode["settings"]["new_tokens"]
    for name, row in decode["rows"].items():
        assert _positive(row["sentences_per_s"]), name
        # eos is suppressed until the cap: every contender runs exactly n_new steps.
        assert row["output_length"] == n_new, name
    if decode["hf_available"]:
        assert any(name.startswith("hf_marian") for name in decode["rows"])

    dropout = on_disk["dropout"]
    assert list(dropout["rows"]) == ["16x8"]
    for row in dropout["rows"].values():
        for name in ("F.dropout", "ours", "x + F.dropout", "ours.add"):
            assert _positive(row["median_s"][name]), name
        assert _positive(row["speedup_dropout"]) and _positive(row["speedup_residual"])

    for name, result in on_disk.items():
        if name == "dropout":  # a measurement behind a design choice, no goal of the issue
            continue
        assert result["goals"]
        assert all(isinstance(g["met"], bool) for g in result["goals"])


def test_every_module_of_bench_is_a_subcommand(benchmark) -> None:
    # Helpers: the shared code, and the serve benchmark's clients (a process of their own).
    helpers = {"__init__", "common", "serve_clients"}
    modules = {p.stem for p in (SCRIPTS / "bench").glob("*.py")} - helpers
    assert {m.__name__.removeprefix("bench.") for m in benchmark.BENCHMARKS.values()} == modules
    assert {"loop", "loop-threads", "engines", "data-memory"} <= set(benchmark.BENCHMARKS)
    assert benchmark.ALL == ["attention", "decode", "dropout", "train"]
    assert benchmark.default_out("data-memory", Path("d")) == Path("d/data_memory.json")


def test_bad_option_is_one_error_line(benchmark, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        guarded(benchmark.main)(["loop", "--steps", "4", "--warmup", "4"])
    assert exited.value.code == EXIT_USER_ERROR
    err = capsys.readouterr().err.splitlines()
    assert err == ["error: --warmup (4) must be below --steps (4); lower --warmup or raise --steps"]


def test_loop_goals_take_medians_of_paired_ratios(benchmark) -> None:
    """The loop's goals: ours against nn.Transformer, and bf16 on the real loop when it ran."""
    from bench.loop import goals

    rates = {
        "bare 32-true": [100.0, 60.0, 100.0],
        "real 32-true": [100.0, 50.0, 80.0],
        "bare bf16-mixed": [200.0, 120.0, 200.0],
        "real bf16-mixed": [150.0, 100.0, 90.0],
        "nn.Transformer 32-true": [50.0, 50.0, 90.0],
    }
    torch_goal, bf16_goal = goals(rates)
    # Per repeat 2.0, 1.2, 1.11: the median of the ratios, not the ratio of the medians (2.0).
    assert torch_goal["goal"].startswith("training step >= 1.5x nn.Transformer")
    assert (torch_goal["value"], torch_goal["met"]) == (1.2, False)
    # The real rows decide (1.5, 2.0, 1.125 -> 1.5; their medians' ratio 1.25), not the bare (2.0).
    assert "real loop" in bf16_goal["goal"]
    assert (bf16_goal["value"], bf16_goal["target"], bf16_goal["met"]) == (1.5, 1.3, True)
    bare_only = {k: v for k, v in rates.items() if k.startswith("bare")}
    assert [g["value"] for g in goals(bare_only)] == [2.0]
    assert goals({"bare 32-true": [1.0]}) == []


@pytest.mark.slow
def test_loop_malloc_quick(benchmark, tmp_path: Path) -> None:
    """Each malloc setting runs in its own process and reports ours, nn.Transformer and faults.

    The quick model's tensors are too small for glibc to map them apart, so the faults are not
    compared here: tests/cli/test_allocator.py holds what the setting does to large blocks.
    """
    out = tmp_path / "loop_malloc.json"
    args = ["loop-malloc", "--quick", "--repeats", "1", "--data", "generated", "--out", str(out)]
    result = benchmark.main(args)["loop-malloc"]
    assert json.loads(out.read_text()) == result
    rows = {row["setting"]: row for row in result["rows"]}
    assert set(rows) == {"kept", "glibc default"}
    for row in rows.values():
        assert _positive(row["ours_tokens_per_s"]) and _positive(row["torch_tokens_per_s"])
        assert row["minor_faults"] > 0
    assert result["goals"][0]["goal"].startswith("training step >= 1.5x nn.Transformer")


@pytest.mark.slow
def test_engines_quick_random_model(benchmark, tmp_path: Path) -> None:
    pytest.importorskip("ctranslate2", reason="the export extra is not installed")
    out = tmp_path / "engines.json"
    result = benchmark.main(["engines", "--quick", "--threads", "1", "--out", str(out)])["engines"]
    assert json.loads(out.read_text()) == result
    assert result["model"] == "random" and result["config"]["d_model"] == 32
    for beam in (1, 2):
        speeds = result["results"][f"beam{beam}"]
        assert set(speeds) == {"ours", "ours_int8", "transformers", "ct2_float32", "ct2_int8"}
        assert all(_positive(row["sentences_per_s"]) for row in speeds.values())
        # A random model runs to the cap: 4 steps, of which ours and generate spend one on eos.
        lengths = result["results"][f"beam{beam}_output_tokens"]
        assert lengths["ours"] == lengths["ours_int8"] == 3
        assert lengths["transformers"] == 3
        assert lengths["ct2_float32"] == lengths["ct2_int8"] == 4
    assert result["environment"]["cpu"]


@pytest.mark.slow
@pytest.mark.parametrize("one_process", [False, True], ids=["per-family", "one-process"])
def test_engines_on_a_checkpoint_times_interleaved_rounds(
    benchmark, tmp_path: Path, one_process: bool
) -> None:
    """With --ckpt every engine translates the whole set once per round: --repeats rounds
    each, timed, the median reported, and the same translations every round; in a process
    per engine family by default, all in one with --one-process."""
    import argparse
    import gzip

    pytest.importorskip("ctranslate2", reason="the export extra is not installed")
    from bench import engines

    args = argparse.Namespace(**{k: v for k, v in engines.QUICK.items() if k != "beams"})
    ckpt = engines.random_checkpoint(args, tmp_path / "random.ckpt")
    data = tmp_path / "data"
    data.mkdir()
    sentences = [" ".join(f"w{5 + (i * 7 + j) % 50}" for j in range(3 + i % 4)) for i in range(6)]
    for lang in ("xx", "yy"):  # the synthetic tokenizer's two languages
        with gzip.open(data / f"test_2016_flickr.{lang}.gz", "wt") as f:
            f.write("\n".join(sentences) + "\n")
    out = tmp_path / "engines.json"
    argv = ["engines", "--ckpt", str(ckpt), "--data-dir", str(data), "--beams", "1",
            "--repeats", "2", "--batch", "4", "--threads", "1", "--out", str(out)]  # fmt: skip
    result = benchmark.main(argv + ["--one-process"] * one_process)["engines"]
    assert json.loads(out.read_text()) == result
    assert result["processes"] == ("one" if one_process else "one per engine family")
    row = result["results"]["beam1"]
    assert set(row) == set(engines.ENGINES)
    for name, timing in row.items():
        assert len(timing["seconds_per_round"]) == 2, name
        assert timing["median_s"] == pytest.approx(sum(timing["seconds_per_round"]) / 2)
        assert timing["sentences_per_s"] == pytest.approx(6 / timing["median_s"])
        assert len(timing["x_generate_per_round"]) == 2 and 0 <= timing["bleu"] <= 100
    assert row["transformers"]["x_generate_per_round"] == [1.0, 1.0]


@pytest.mark.slow
def test_engines_torch_family_never_loads_ctranslate2(benchmark, tmp_path: Path) -> None:
    """The torch engines' process holds no CTranslate2 (whose own OpenMP slows torch once it
    has run): built in a fresh interpreter, it has not imported the library."""
    import argparse
    import subprocess
    import sys

    pytest.importorskip("ctranslate2", reason="the export extra is not installed")
    from bench import engines

    args = argparse.Namespace(**{k: v for k, v in engines.QUICK.items() if k != "beams"})
    ckpt = engines.random_checkpoint(args, tmp_path / "random.ckpt")
    hf_dir, ct2_dir = engines.exports(ckpt, tmp_path)
    code = (
        "import sys\n"
        "from pathlib import Path\n"
        "from bench import engines\n"
        f"e = engines.engines(('torch',), Path({str(ckpt)!r}), Path({str(hf_dir)!r}), "
        f"Path({str(ct2_dir)!r}), 1)\n"
        "print(sorted(k for k in e if k != 'loaded'), 'ctranslate2' in sys.modules)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=SCRIPTS, capture_output=True, text=True, check=True
    )
    assert done.stdout.split("\n")[-2] == "['hf', 'ours_int8'] False"


@pytest.mark.slow
def test_engines_worker_that_cannot_start_fails_the_run(benchmark, tmp_path: Path) -> None:
    """A worker that cannot build its engines answers with its traceback, and every worker
    process is gone afterwards."""
    from bench import engines

    spec = {"ckpt": tmp_path / "missing.ckpt", "hf_dir": tmp_path, "ct2_dir": tmp_path,
            "threads": 1}  # fmt: skip
    with pytest.raises(RuntimeError, match="an engine worker failed"):
        engines.Workers(spec, one_process=True)
    import multiprocessing

    assert not multiprocessing.active_children()


@pytest.mark.slow
def test_sweep_benchmark_quick(benchmark, tmp_path: Path) -> None:
    """Four real (tiny) studies: the JSON holds each one's wall time, trials and the goals."""
    out = tmp_path / "sweep.json"
    results = benchmark.main(["sweep", "--quick", "--threads", "1", "--out", str(out)])
    result = json.loads(out.read_text())
    assert set(result["studies"]) == {"unpruned", "pruned", "one worker", "two workers"}
    for name, study in result["studies"].items():
        assert _positive(study["seconds"]), name
        finished = [t for t in study["trials"] if t["state"] in ("COMPLETE", "PRUNED")]
        assert len(finished) == 2, name
    assert result["studies"]["two workers"]["workers"] == 2
    # The same seed draws the same parameters per trial number, pruned or not.
    params = [[t["params"] for t in result["studies"][n]["trials"]] for n in ("unpruned", "pruned")]
    assert params[0] == params[1]
    assert [g["goal"] for g in result["goals"]] == [
        "pruned / unpruned wall time",
        "unpruned best - pruned best val/bleu",
        "two workers / one worker wall time",
    ]
    assert results["sweep"]["environment"]["cpu"]


def test_steer_benchmark_quick(benchmark, tiny_run_dir: Path, tmp_path: Path) -> None:
    """Every steered contender runs on a real checkpoint; prefixes and constraints hold."""
    from transformer_mt.data.numbers import number_sentences

    src, tgt = number_sentences(list(range(7, 200, 11)), "en", "de", seed=2)
    (tmp_path / "s.en").write_text("\n".join(src) + "\n", encoding="utf-8")
    (tmp_path / "r.de").write_text("\n".join(tgt) + "\n", encoding="utf-8")
    out = tmp_path / "steer.json"
    args = ["steer", "--quick", "--threads", "1", "--out", str(out), "--ckpt",
            str(best_checkpoint(tiny_run_dir)), "--source", str(tmp_path / "s.en"),
            "--reference", str(tmp_path / "r.de")]  # fmt: skip
    result = benchmark.main(args)["steer"]
    assert json.loads(out.read_text()) == result and result["sentences"] == 16
    r = result["results"]
    assert set(r) == {"greedy", "sampling", "prefix", "beam", "constrained"}
    assert all(_positive(row["sentences_per_s"]) for row in r.values())
    assert r["prefix"]["starts_with_prefix"] == 16
    assert r["constrained"]["satisfied"] == r["constrained"]["sentences_with_constraints"] > 0
