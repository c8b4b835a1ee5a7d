"""Dropout benchmark: forward+backward of ``torch.nn.functional.dropout`` vs ours
(:mod:`transformer_mt.model.dropout`), alone and fused into the residual addition.

A measurement behind a design choice (docs/design.md), so it states no goals.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from bench.common import Table, environment, interleaved_times, median
from transformer_mt.model.dropout import Dropout

NAME = "dropout"
HELP = "dropout and dropout+residual: ours vs torch"
#: One of the micro-benchmarks that ``benchmark.py all`` runs.
IN_ALL = True
QUICK = {"shapes": [[16, 8]], "repeats": 2}


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Options of ``benchmark.py dropout``."""
    p.add_argument("--p", type=float, default=0.2, help="dropout probability")
    p.add_argument(
        "--shapes",
        type=int,
        nargs=2,
        action="append",
        default=None,
        metavar=("TOKENS", "WIDTH"),
        help="activation shapes (repeatable; default 2048x256, 2048x512, 4096x1024)",
    )
    p.add_argument("--repeats", type=int, default=15)


def _dropout_contenders(tokens: int, width: int, p: float) -> dict[str, Callable[[], None]]:
    """Forward+backward callables: torch's dropout vs ours, alone and in a residual."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(tokens, width, generator=gen, requires_grad=True)
    residual = torch.randn(tokens, width, generator=gen, requires_grad=True)
    ours = Dropout(p).train()

    def fwd_bwd(fn: Callable[[], Tensor]) -> Callable[[], None]:
        def step() -> None:
            fn().sum().backward()
            x.grad = residual.grad = None

        return step

    return {
        "F.dropout": fwd_bwd(lambda: F.dropout(x, p, True)),
        "ours": fwd_bwd(lambda: ours(x)),
        "x + F.dropout": fwd_bwd(lambda: residual + F.dropout(x, p, True)),
        "ours.add": fwd_bwd(lambda: ours.add(residual, x)),
    }


#: Activation shapes (tokens x width) of ``dropout`` when ``--shapes`` is not given.
DROPOUT_SHAPES = [[2048, 256], [2048, 512], [4096, 1024]]


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Forward+backward time of torch's dropout vs ours, alone and fused into the residual."""
    shapes = args.shapes or DROPOUT_SHAPES  # append-style options cannot carry a default
    rows: dict[str, Any] = {}
    for tokens, width in shapes:
        contenders = _dropout_contenders(tokens, width, args.p)
        times = interleaved_times(contenders, repeats=args.repeats, warmup=2)
        med = {name: median(t) for name, t in times.items()}
        rows[f"{tokens}x{width}"] = {
            "median_s": med,
            "times_s": times,
            "speedup_dropout": med["F.dropout"] / med["ours"],
            "speedup_residual": med["x + F.dropout"] / med["ours.add"],
        }
    return {
        "benchmark": "dropout",
        "settings": {"p": args.p, "shapes": shapes, "repeats": args.repeats},
        "rows": rows,
        "goals": [],
        "environment": environment(),
    }


def tables(result: dict[str, Any]) -> list[Table]:
    header = [
        "tokens x width",
        "F.dropout ms",
        "ours ms",
        "speed-up",
        "x + F.dropout ms",
        "ours.add ms",
        "speed-up",
    ]
    rows = [
        [
            shape,
            f"{1e3 * r['median_s']['F.dropout']:.2f}",
            f"{1e3 * r['median_s']['ours']:.2f}",
            f"{r['speedup_dropout']:.2f}x",
            f"{1e3 * r['median_s']['x + F.dropout']:.2f}",
            f"{1e3 * r['median_s']['ours.add']:.2f}",
            f"{r['speedup_residual']:.2f}x",
        ]
        for shape, r in result["rows"].items()
    ]
    title = f"Dropout p={result['settings']['p']}, forward + backward, median"
    return [(title, header, rows)]
