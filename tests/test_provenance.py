"""run_info.json: each start of a run records the machine, the code and the command."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from transformer_mt.provenance import cpu_model, source_version

from conftest import ROOT, short_run, write_corpus


def test_each_start_of_a_run_is_recorded(tmp_path: Path) -> None:
    corpus = write_corpus(tmp_path / "corpus")
    last = short_run(tmp_path / "run", corpus)
    short_run(tmp_path / "run", corpus, f"ckpt_path={last}", "trainer.max_steps=4")
    starts = json.loads((tmp_path / "run" / "run_info.json").read_text())["starts"]
    assert len(starts) == 2
    for start in starts:
        assert start["machine"]["cpu"] == cpu_model() != "unknown"
        assert start["machine"]["threads"] == 1  # FILES_TRAIN runs with threads=1
        assert start["source"] == source_version()


def test_source_version_is_the_checkout_head() -> None:
    head = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True
    )
    if head.returncode != 0:  # an unpacked source tree
        assert source_version()["commit"] is None
    else:
        assert source_version()["commit"] == head.stdout.strip()
    assert source_version(Path("/"))["commit"] is None
