"""run_info.json: each start of a run records the machine, the code and the command."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest
import torch

from transformer_mt.provenance import (
    cpu_model,
    cpu_model_number,
    cpu_units,
    machine,
    peak_resident_bytes,
    source_version,
)

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


def test_the_cpu_generation_and_its_units_are_read_from_cpuinfo(tmp_path: Path) -> None:
    """One family number covers CPUs with and without AVX-512 (AMD's 25: Zen 3 and Zen 4),
    so the model number and the vector/matrix units are recorded beside it."""
    info = tmp_path / "cpuinfo"
    info.write_text(
        "processor\t: 0\ncpu family\t: 25\nmodel\t\t: 17\nmodel name\t: AMD EPYC\n"
        "flags\t\t: fpu sse avx2 avx512f avx512bw avx512_bf16 avx512_vnni\n\n"
        "processor\t: 1\ncpu family\t: 25\nmodel\t\t: 17\n"
    )
    assert cpu_model_number(info) == 17
    assert cpu_units(info) == ["avx2", "avx512f", "avx512_vnni", "avx512_bf16"]
    zen3 = tmp_path / "zen3"
    zen3.write_text("cpu family\t: 25\nmodel\t\t: 1\nflags\t\t: fpu avx avx2 fma\n")
    assert (cpu_model_number(zen3), cpu_units(zen3)) == (1, ["avx2"])
    assert (cpu_model_number(tmp_path / "missing"), cpu_units(tmp_path / "missing")) == (None, [])
    recorded = machine()
    assert recorded["cpu_model_number"] == cpu_model_number()
    assert recorded["cpu_units"] == cpu_units()


def test_peak_resident_memory_is_in_bytes_and_covers_what_is_held() -> None:
    statm = Path("/proc/self/statm")
    if not statm.is_file():
        pytest.skip("needs Linux's /proc/self/statm to read the resident size")
    held = torch.ones(32 * 2**20)  # 128 MiB, every page touched
    resident = int(statm.read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    peak = peak_resident_bytes()
    # The kernel updates its high-water mark lazily, so it may trail the resident size a little;
    # a unit mistake (KiB, pages) would be off by a thousandfold.
    assert peak is not None and resident // 2 <= peak < 1000 * resident
    assert held.sum().item() == held.numel()


def test_the_training_summary_shows_the_peak_memory(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    short_run(tmp_path / "run", write_corpus(tmp_path / "corpus"))
    assert re.search(r"peak memory +│ \d+\.\d\d GB resident", capsys.readouterr().out)
