"""Training tokens/s with freed memory kept in the heap (the commands' default) or handed back.

glibc serves large blocks with ``mmap`` and unmaps them when they are freed, so a training
step's (tokens x vocabulary) tensors are mapped, faulted in page by page and unmapped every
step; ``transformer_mt.cli.allocator.keep_freed_memory`` (called by train.py, evaluate.py and
every benchmark) keeps them in the heap instead. glibc reads its own settings once, at
start-up, so each setting runs ``benchmark.py loop --no-real`` (our bare step and
``nn.Transformer``'s, fp32, the same batches) in a process of its own: ``kept`` as the commands
run, ``glibc default`` with ``TRANSFORMER_MT_MALLOC=default`` in its environment, which leaves
glibc as it is (any ``MALLOC_*`` setting would also switch off glibc's own adjustment of its
mmap threshold, and so not measure the default). The settings alternate over ``--repeats``
rounds (each round starts with another one); each figure is the median over rounds, and the
minor page faults are the whole benchmark process's (start-up and data preparation included),
from ``getrusage``.

    python scripts/benchmark.py loop-malloc --repeats 3 --out docs/benchmarks/loop_malloc.json
"""

from __future__ import annotations

import argparse
import logging
import os
import resource
import statistics
import tempfile
from pathlib import Path
from typing import Any

from bench.common import Table, environment, goal
from bench.loop import add_step_arguments, check_steps
from bench.loop_threads import loop_in_process

NAME = "loop-malloc"
HELP = "bare training step, ours and nn.Transformer, with freed memory kept or unmapped"
#: Setting name -> what its process's environment adds.
SETTINGS = {"kept": {}, "glibc default": {"TRANSFORMER_MT_MALLOC": "default"}}

log = logging.getLogger("bench.loop_malloc")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Options of ``benchmark.py loop-malloc``."""
    add_step_arguments(p)


def _environ(extra: dict[str, str]) -> dict[str, str]:
    """This process's environment without malloc settings, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    env.pop("GLIBC_TUNABLES", None)
    env.pop("TRANSFORMER_MT_MALLOC", None)
    return {**env, **extra}


def _one_round(args: argparse.Namespace, setting: str, out: Path) -> dict[str, float]:
    """Ours, nn.Transformer and the process's minor faults for one setting, one process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_minflt
    options = ["--no-real", "--threads", str(args.threads)]
    result = loop_in_process(args, options, _environ(SETTINGS[setting]), out)
    faults = resource.getrusage(resource.RUSAGE_CHILDREN).ru_minflt - before
    by_name = {row["contender"]: row["tokens_per_s"] for row in result["rows"]}
    return {
        "ours": by_name["bare"],
        "nn.Transformer": by_name["nn.Transformer"],
        "minor_faults": float(faults),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    check_steps(args)
    names = list(SETTINGS)
    rounds: dict[str, list[dict[str, float]]] = {n: [] for n in names}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeats):
            shift = r % len(names)
            for setting in names[shift:] + names[:shift]:
                figures = _one_round(args, setting, Path(tmp) / f"{r}-{len(rounds[setting])}.json")
                rounds[setting].append(figures)
                log.info(
                    "round %d %-14s ours %6.0f  nn.Transformer %6.0f tok/s  %9.0f faults",
                    r + 1,
                    setting,
                    figures["ours"],
                    figures["nn.Transformer"],
                    figures["minor_faults"],
                )
    rows = []
    for setting, figures in rounds.items():
        rows.append(
            {
                "setting": setting,
                "ours_tokens_per_s": statistics.median(f["ours"] for f in figures),
                "torch_tokens_per_s": statistics.median(f["nn.Transformer"] for f in figures),
                "ours_vs_torch": statistics.median(
                    f["ours"] / f["nn.Transformer"] for f in figures
                ),
                "minor_faults": statistics.median(f["minor_faults"] for f in figures),
                "rounds": figures,
            }
        )
    kept, default = rows[0], rows[1]
    return {
        "benchmark": "loop-malloc",
        "settings": {"steps": args.steps, "warmup_steps": args.warmup, "rounds": args.repeats},
        "rows": rows,
        "kept_vs_default_ours": kept["ours_tokens_per_s"] / default["ours_tokens_per_s"],
        "goals": [
            goal(
                "training step >= 1.5x nn.Transformer (fp32, issue 31)", kept["ours_vs_torch"], 1.5
            )
        ],
        "environment": environment(),
    }


def tables(result: dict[str, Any]) -> list[Table]:
    header = ["malloc", "ours tok/s", "nn.Transformer tok/s", "ours / torch", "minor faults"]
    rows = [
        [
            r["setting"],
            f"{r['ours_tokens_per_s']:,.0f}",
            f"{r['torch_tokens_per_s']:,.0f}",
            f"{r['ours_vs_torch']:.2f}x",
            f"{r['minor_faults']:,.0f}",
        ]
        for r in result["rows"]
    ]
    title = (
        f"Bare training step by malloc setting (medians of {result['settings']['rounds']} "
        f"rounds); kept / default, ours: {result['kept_vs_default_ours']:.2f}x"
    )
    return [(title, header, rows)]
