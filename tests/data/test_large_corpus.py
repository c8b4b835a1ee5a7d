"""Large-corpus tooling: the synthetic corpus writer and the cached, memory-mapped pipeline.

The full-size measurement (1M pairs, docs/scaling.md) takes minutes; here the same
scripts run on a few thousand pairs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, load_script

make_large_corpus = load_script("make_large_corpus")


def _lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


def test_make_large_corpus_writes_aligned_files(tmp_path: Path) -> None:
    make_large_corpus.main(
        [str(tmp_path / "c"), "--pairs", "500", "--base", "60", "--eval-pairs", "20", "--seed", "1"]
    )
    tmp_path = tmp_path / "c"
    for prefix, n in (("train", 500), ("val", 20), ("test", 20)):
        src, tgt = _lines(tmp_path / f"{prefix}.en"), _lines(tmp_path / f"{prefix}.de")
        assert len(src) == len(tgt) == n
        assert all(s and t for s, t in zip(src, tgt))
    train = _lines(tmp_path / "train.en")
    # Pairs join 2-3 base sentences, so they are long and (nearly) all different.
    assert len(set(train)) > 0.95 * len(train)
    assert min(s.count(".") for s in train) >= 2
    # Evaluation sentences use numbers that training never saw.
    test_sentences = set(_lines(tmp_path / "test.en"))
    train_sentences = {part.strip() + "." for s in train for part in s.split(".") if part}
    assert not test_sentences & train_sentences


def test_make_large_corpus_never_replaces_files_it_did_not_write(tmp_path, capsys) -> None:
    corpus = tmp_path / "real"
    corpus.mkdir()
    (corpus / "train.en").write_text("a real line\n")
    small = ["--pairs", "20", "--base", "30", "--eval-pairs", "5"]
    with pytest.raises(SystemExit) as exited:
        make_large_corpus.main([str(corpus), *small])
    assert exited.value.code == 2
    assert "not written by make_large_corpus.py" in capsys.readouterr().err
    assert (corpus / "train.en").read_text() == "a real line\n"
    ours = tmp_path / "ours"
    make_large_corpus.main([str(ours), *small])
    with pytest.raises(SystemExit):
        make_large_corpus.main([str(ours), *small])  # its own: only with --force
    assert "pass --force" in capsys.readouterr().err
    make_large_corpus.main([str(ours), *small, "--force"])
    assert len(_lines(ours / "train.en")) == 20


@pytest.mark.slow
def test_second_run_reuses_the_arrow_cache(tmp_path: Path) -> None:
    """Run 1 tokenizes into the cache; run 2 memory-maps it, faster and without rewriting."""
    corpus, cache, work = tmp_path / "corpus", tmp_path / "cache", tmp_path / "run"
    make_large_corpus.main([str(corpus), "--pairs", "20000", "--base", "2000"])
    env = dict(os.environ, OMP_NUM_THREADS="1")

    def bench(name: str) -> dict:
        out = tmp_path / f"{name}.json"
        command = [
            sys.executable,
            str(ROOT / "scripts" / "benchmark.py"),
            "data-memory",
            str(corpus),
            "--cache-dir",
            str(cache),
            "--work-dir",
            str(work),
            "--vocab-size",
            "1000",
            "--batches",
            "20",
            "--threads",
            "1",
            "--out",
            str(out),
        ]
        proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-4000:]
        return json.loads(out.read_text())

    first = bench("first")
    arrow = {p: p.stat().st_mtime_ns for p in cache.glob("*.arrow")}
    second = bench("second")
    assert not first["cache_existed"] and second["cache_existed"]
    assert {p: p.stat().st_mtime_ns for p in cache.glob("*.arrow")} == arrow
    assert second["prepare"]["seconds"] < first["prepare"]["seconds"]
    assert second["train_pairs"] == first["train_pairs"] > 19000
    assert second["first_20_batches"]["seconds"] < 30
