"""Benchmarks of transformer-mt against PyTorch and Hugging Face references (CPU, fp32).

Subcommands (``--help`` on each lists its options):

* ``attention``: forward+backward time and saved-activation memory of our
  ``MultiHeadAttention`` (fused and explicit) vs ``torch.nn.MultiheadAttention``.
* ``train``: target tokens/s of a full training step of our ``Transformer`` vs
  ``torch.nn.Transformer`` wrapped in the same embeddings and output layer; model FLOPs
  utilisation (MFU) against a measured matmul peak.
* ``decode``: sentences/s of greedy and beam search, with and without the KV cache, vs
  ``transformers.MarianMTModel.generate`` with a random model of the same dimensions.
* ``dropout``: forward+backward of ``torch.nn.functional.dropout`` vs ours
  (``transformer_mt.model.dropout``), alone and fused into the residual addition.
* ``all``: the four in a row.

Each lives in its own module of ``scripts/bench/`` over the shared helpers of
``scripts/bench/common.py``; this file only parses the command line and dispatches.

Each writes ``bench_results/<name>.json`` (or ``--out``) with the settings, raw timings,
medians, goals (met or missed) and the environment, and prints a table (``--format
markdown`` for the README). ``--quick`` shrinks every size for a smoke run in seconds; its
numbers are not meaningful.

Example::

    .venv/bin/python scripts/benchmark.py all --format markdown --plot
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from bench import attention, decode, dropout, train
from bench.common import (
    COMMON_OPTIONS,
    add_common_arguments,
    print_tables,
    setup_torch,
    write_json,
)

#: Subcommand name -> module with NAME, HELP, QUICK, add_arguments, run and tables.
BENCHMARKS = {module.NAME: module for module in (attention, train, decode, dropout)}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for name, module in BENCHMARKS.items():
        p = sub.add_parser(name, help=module.HELP)
        module.add_arguments(p)
        add_common_arguments(p)
    p_all = sub.add_parser("all", help="attention, train, decode and dropout with their defaults")
    add_common_arguments(p_all)
    return parser


def _namespace_for(name: str, args: argparse.Namespace) -> argparse.Namespace:
    """Defaults of subcommand ``name`` overlaid with the common options of ``args``."""
    parser = argparse.ArgumentParser()
    BENCHMARKS[name].add_arguments(parser)
    ns = parser.parse_args([])
    for key in COMMON_OPTIONS:
        setattr(ns, key, getattr(args, key))
    return ns


def run_one(name: str, args: argparse.Namespace) -> dict[str, Any]:
    """Run benchmark ``name``, print its tables and write its JSON; return the result."""
    module = BENCHMARKS[name]
    if args.quick:
        for key, value in module.QUICK.items():
            setattr(args, key, value)
    args.out_path = args.out if args.out is not None else args.out_dir / f"{name}.json"
    setup_torch(args.threads)
    result = module.run(args)
    print_tables(module.tables(result), args.format)
    for g in result["goals"]:
        mark = "MET " if g["met"] else "MISS"
        print(f"[{mark}] {g['goal']}: {g['value']} (target {g['comparison']} {g['target']})")
    write_json(result, args.out_path)
    print(f"wrote {args.out_path}")
    return result


def main(argv: list[str] | None = None) -> dict[str, dict[str, Any]]:
    args = build_parser().parse_args(argv)
    if args.command != "all":
        return {args.command: run_one(args.command, args)}
    if args.out is not None:
        args.out_dir = args.out  # with `all`, --out names the folder
    args.out = None
    return {name: run_one(name, _namespace_for(name, args)) for name in BENCHMARKS}


if __name__ == "__main__":
    main(sys.argv[1:])
