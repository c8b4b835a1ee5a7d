"""Every benchmark of transformer-mt, one subcommand each (``--help`` lists them).

``all`` runs the micro-benchmarks of our modules against PyTorch and Hugging Face references
(attention, train, decode, dropout); the others measure the training loop, the decode
engines, data preparation and whatever ``scripts/bench/`` holds besides.

Each subcommand is one module of ``scripts/bench/``, found by this file at start-up, over the
shared helpers of ``scripts/bench/common.py``; this file only parses the command line,
dispatches, prints and writes. Adding a benchmark is one new file: see ``scripts/README.md``.

Each writes ``bench_results/<name>.json`` (or ``--out``) with the settings, raw timings,
medians, goals where it has some and the environment (CPU model, threads, load), and prints
its tables (``--format markdown`` for docs) with the environment line beside them.
``--quick`` shrinks every size for a smoke run in seconds; its numbers are not meaningful.

Example::

    .venv/bin/python scripts/benchmark.py all --format markdown --plot
    .venv/bin/python scripts/benchmark.py loop --precisions 32-true --repeats 5
"""

from __future__ import annotations

import argparse
import importlib
import logging
import pkgutil
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

# Before torch loads (bench imports it): the thread wait, oneDNN's kernel cache and the heap,
# as train.py sets them, so that the loops measured are the loops users run
# (TRANSFORMER_MT_MALLOC=default in the environment measures glibc's default instead).
from transformer_mt.cli.entry import prepare

prepare(keep_heap=True)

import bench  # noqa: E402
from bench.common import (  # noqa: E402
    COMMON_OPTIONS,
    add_common_arguments,
    add_plot_argument,
    add_profile_argument,
    environment_line,
    print_tables,
    setup_torch,
    write_json,
)
from transformer_mt.errors import guarded  # noqa: E402


def discover() -> dict[str, ModuleType]:
    """Subcommand name -> module, for every module of ``scripts/bench/`` that defines ``NAME``."""
    found = {}
    for info in pkgutil.iter_modules(bench.__path__):
        module = importlib.import_module(f"bench.{info.name}")
        if hasattr(module, "NAME"):
            found[module.NAME] = module
    return dict(sorted(found.items()))


BENCHMARKS = discover()
#: What ``all`` runs, in this order: the modules that set ``IN_ALL = True``.
ALL = [name for name, module in BENCHMARKS.items() if getattr(module, "IN_ALL", False)]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for name, module in BENCHMARKS.items():
        p = sub.add_parser(name, help=module.HELP, description=module.__doc__)
        p.formatter_class = argparse.RawDescriptionHelpFormatter
        module.add_arguments(p)
        add_common_arguments(p)
    p_all = sub.add_parser("all", help=f"{', '.join(ALL)} with their defaults")
    add_common_arguments(p_all)
    add_profile_argument(p_all)
    add_plot_argument(p_all)
    return parser


def _namespace_for(name: str, args: argparse.Namespace) -> argparse.Namespace:
    """Defaults of subcommand ``name`` overlaid with the options of ``all`` that it takes."""
    parser = argparse.ArgumentParser()
    BENCHMARKS[name].add_arguments(parser)
    ns = parser.parse_args([])
    for key, value in vars(args).items():
        if key in COMMON_OPTIONS or hasattr(ns, key):
            setattr(ns, key, value)
    return ns


def default_out(name: str, out_dir: Path) -> Path:
    """``OUT_DIR/<name>.json``, dashes as underscores (``data-memory`` -> ``data_memory.json``)."""
    return out_dir / f"{name.replace('-', '_')}.json"


def run_one(name: str, args: argparse.Namespace) -> dict[str, Any]:
    """Run benchmark ``name``, print its tables and write its JSON; return the result."""
    module = BENCHMARKS[name]
    if args.quick:
        for key, value in getattr(module, "QUICK", {}).items():
            setattr(args, key, value)
    args.out_path = args.out if args.out is not None else default_out(name, args.out_dir)
    setup_torch(args.threads)
    result = module.run(args)
    print_tables(module.tables(result), args.format)
    for g in result.get("goals", []):
        mark = "MET " if g["met"] else "MISS"
        print(f"[{mark}] {g['goal']}: {g['value']} (target {g['comparison']} {g['target']})")
    if "environment" in result:
        print(environment_line(result["environment"]))
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
    return {name: run_one(name, _namespace_for(name, args)) for name in ALL}


if __name__ == "__main__":
    # The benchmarks' progress lines (bench.* loggers), without every library's INFO lines.
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    logging.getLogger("bench").addHandler(handler)
    logging.getLogger("bench").setLevel(logging.INFO)
    guarded(main)(sys.argv[1:])
