"""cli/entry.py: oneDNN keeps the kernels of more shapes than one epoch asks for, and a
capacity set in the environment wins.

Each case runs in a fresh interpreter (oneDNN reads its cache size once) and counts events, not
time: oneDNN's verbose log names every kernel it had to compile (``cache_miss``). Where torch
does not multiply bf16 through oneDNN (no AVX-512 or bf16 units) there is nothing to count and
the test skips.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

#: More distinct bf16 matrix-product shapes than oneDNN's default cache holds, twice over; a
#: marker line separates the second pass, whose compilations are what a kept cache avoids.
PROBE = """
import sys
from transformer_mt.cli.entry import prepare
prepare()
import torch
torch.set_num_threads(1)
w = torch.randn(8, 8, dtype=torch.bfloat16)
xs = [torch.randn(i + 1, 8, dtype=torch.bfloat16) for i in range(int(sys.argv[1]))]
for x in xs:
    x @ w
print("SECOND PASS", flush=True)
for x in xs:
    x @ w
"""

SHAPES = 1100  # oneDNN's default capacity is 1024


def _second_pass_misses(env_capacity: str | None) -> int | None:
    env = {k: v for k, v in os.environ.items() if k != "ONEDNN_PRIMITIVE_CACHE_CAPACITY"}
    env["ONEDNN_VERBOSE"] = "2"  # primitive creation (cache hit or miss) and execution
    if env_capacity is not None:
        env["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] = env_capacity
    out = subprocess.run(
        [sys.executable, "-c", PROBE, str(SHAPES)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    ).stdout
    first, _, second = out.partition("SECOND PASS")
    if "cache_miss" not in first:
        return None  # bf16 products do not go through oneDNN on this CPU
    return second.count("cache_miss")


def test_the_kernel_cache_outlasts_many_shapes() -> None:
    misses = _second_pass_misses(None)
    if misses is None:
        pytest.skip("torch multiplies bf16 without oneDNN on this CPU")
    assert misses == 0


def test_a_capacity_in_the_environment_wins() -> None:
    misses = _second_pass_misses("1024")
    if misses is None:
        pytest.skip("torch multiplies bf16 without oneDNN on this CPU")
    assert misses >= SHAPES - 1024  # the first shapes were forgotten before their second use
