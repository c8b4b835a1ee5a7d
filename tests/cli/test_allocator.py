"""cli/allocator.py: freed large blocks stay in the heap, and a user's malloc setting wins.

Each case runs in a fresh interpreter: glibc's settings are process-wide and this test
process must keep its own. The measure is the kernel's count of minor page faults
(``getrusage``), which counts events, not time: a 64 MiB block that glibc unmaps on ``free``
faults in all of its pages again at the next allocation, and one kept in the heap does not.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from transformer_mt.cli import allocator

pytestmark = pytest.mark.skipif(
    allocator.glibc() is None, reason="glibc's mallopt is what this module sets"
)

#: Allocates, fills and frees a 64 MiB block ROUNDS times after a first round that grows the
#: heap, and prints what keep_freed_memory returned and the faults of the rounds.
PROBE = """
import json, resource, sys
from transformer_mt.cli import allocator
applied = allocator.keep_freed_memory() if sys.argv[1] == "keep" else False
block = 64 << 20
def one_round():
    b = bytearray(block)  # malloc, then every byte written: every page touched
    del b
one_round()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(5):
    one_round()
faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
print(json.dumps({"applied": applied, "faults": faults}))
"""


#: Environment variables that would change what the probes measure.
MALLOC_ENV = ("MALLOC_", "GLIBC_TUNABLES", allocator.SWITCH)


def probe(mode: str, **env: str) -> dict:
    """Run PROBE in a fresh interpreter with no malloc settings but ``env``."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(MALLOC_ENV)}
    done = subprocess.run(
        [sys.executable, "-c", PROBE, mode],
        env={**clean, **env},
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(done.stdout)


def test_freed_blocks_are_reused_without_faulting_again():
    kept, default = probe("keep"), probe("default")
    assert kept["applied"] is True
    # Five rounds of 16,384 pages each fault ~82,000 times when every block is a new mapping.
    pages = 5 * (64 << 20) // os.sysconf("SC_PAGE_SIZE")
    assert default["faults"] >= pages // 2, default
    assert kept["faults"] <= pages // 20, kept


def test_the_switch_or_a_malloc_setting_in_the_environment_wins():
    for env in (
        {allocator.SWITCH: "default"},
        {"MALLOC_MMAP_MAX_": "65536"},
        {"GLIBC_TUNABLES": "glibc.malloc.mmap_max=65536"},
    ):
        chosen = probe("keep", **env)
        assert chosen["applied"] is False, env
        # glibc maps blocks this large anew each time, as the user asked: they fault in again.
        assert chosen["faults"] >= 5 * (64 << 20) // os.sysconf("SC_PAGE_SIZE") // 2


def test_calling_twice_is_harmless():
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "from transformer_mt.cli import allocator as a; "
            "print(a.keep_freed_memory(), a.keep_freed_memory())",
        ],
        env={k: v for k, v in os.environ.items() if not k.startswith(MALLOC_ENV)},
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.split() == ["True", "True"]
