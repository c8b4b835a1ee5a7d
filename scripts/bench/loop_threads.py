"""Bare-step tokens/s of the ``loop`` benchmark per thread setting (threads x OpenMP waiting).

The waiting of OpenMP's threads between parallel regions: ``ACTIVE`` spins, ``PASSIVE`` sleeps
at once, and a short spin (``GOMP_SPINCOUNT=10000`` with no policy set: GNU OpenMP, which the
torch wheels use) spins a few microseconds, then sleeps. OpenMP reads these once, when torch
loads, so each setting runs
``benchmark.py loop --bare-only`` in a process of its own; the settings alternate over
``--repeats`` rounds (each round starts with another one) and each figure is the median.

    python scripts/benchmark.py loop-threads --out docs/benchmarks/loop_threads.json
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.common import Table, environment
from bench.loop import add_step_arguments, check_steps

NAME = "loop-threads"
HELP = "bare training step per (threads, OpenMP waiting), one process each"
BENCHMARK = Path(__file__).resolve().parents[1] / "benchmark.py"
#: Thread settings compared: (intra-op threads, OpenMP waiting: a policy, or a spin count).
THREAD_SETTINGS = [(2, "ACTIVE"), (2, "PASSIVE"), (2, "GOMP_SPINCOUNT=10000"), (1, "PASSIVE")]


def waiting_env(policy: str) -> dict[str, str]:
    """The environment of a setting: ``OMP_WAIT_POLICY=policy``, or for a spin count that
    count with no policy (a policy would override it)."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    if policy.startswith("GOMP_SPINCOUNT="):
        return {**env, "GOMP_SPINCOUNT": policy.split("=", 1)[1]}
    return {**env, "OMP_WAIT_POLICY": policy}


log = logging.getLogger("bench.loop_threads")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Options of ``benchmark.py loop-threads`` (``--threads`` is ignored: it is the study)."""
    add_step_arguments(p)


def loop_in_process(
    args: argparse.Namespace, options: list[str], env: dict[str, str], out: Path
) -> dict[str, Any]:
    """The JSON of one fp32 ``benchmark.py loop --repeats 1`` run in a fresh process with
    ``env`` as its environment and ``options`` added to its command line."""
    command = [
        sys.executable,
        str(BENCHMARK),
        "loop",
        "--repeats",
        "1",
        "--precisions",
        "32-true",
        "--steps",
        str(args.steps),
        "--warmup",
        str(args.warmup),
        "--data",
        args.data,
        "--data-dir",
        str(args.data_dir),
        "--out",
        str(out),
        *options,
    ] + (["--quick"] if args.quick else [])
    subprocess.run(command, env=env, check=True, capture_output=True)
    return json.loads(out.read_text())


def bare_rate(args: argparse.Namespace, threads: int, policy: str, out: Path) -> float:
    """Median bare fp32 tokens/s of one ``loop`` run in a fresh process."""
    options = ["--bare-only", "--no-torch", "--threads", str(threads)]
    return loop_in_process(args, options, waiting_env(policy), out)["rows"][0]["tokens_per_s"]


def run(args: argparse.Namespace) -> dict[str, Any]:
    check_steps(args)
    rates: dict[str, list[float]] = {f"{t} threads, {p}": [] for t, p in THREAD_SETTINGS}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeats):
            shift = r % len(THREAD_SETTINGS)
            for threads, policy in THREAD_SETTINGS[shift:] + THREAD_SETTINGS[:shift]:
                name = f"{threads}-{policy.replace('=', '-')}-{r}.json"
                rate = bare_rate(args, threads, policy, Path(tmp) / name)
                rates[f"{threads} threads, {policy}"].append(rate)
                log.info("round %d %d threads %-7s %8.0f tok/s", r + 1, threads, policy, rate)
    return {
        "benchmark": "loop-threads",
        "settings": {"steps": args.steps, "warmup_steps": args.warmup, "rounds": args.repeats},
        "rows": [
            {"setting": k, "bare_tokens_per_s": statistics.median(v), "all": v}
            for k, v in rates.items()
        ],
        "environment": environment(),
    }


def tables(result: dict[str, Any]) -> list[Table]:
    rows = [[r["setting"], f"{r['bare_tokens_per_s']:,.0f}"] for r in result["rows"]]
    return [("Bare training step per thread setting", ["setting", "tok/s (median)"], rows)]
