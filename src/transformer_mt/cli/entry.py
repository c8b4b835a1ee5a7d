"""The commands' entry points: each prepares the process (:func:`prepare`), then imports its
command, so that the settings below are in the environment before torch loads.

Nothing here acts at import. OpenMP and oneDNN read their settings once, when torch loads its
libraries; malloc's is applied by a call (:mod:`transformer_mt.cli.allocator`).

- How OpenMP's threads wait between parallel regions: threads that spin for long (OpenMP's
  default) burn the core a descheduled sibling needs on a busy CPU, threads that sleep at once
  (``OMP_WAIT_POLICY=PASSIVE``) are woken for every small region, and a step of a small model
  is many of them. A short spin (GNU OpenMP's ``GOMP_SPINCOUNT``; the torch wheels use GNU
  OpenMP) keeps them awake within a step, then lets them sleep.
- How many compiled matrix-product kernels oneDNN keeps: on a CPU with bf16 units torch runs
  bf16 products through oneDNN, which compiles a kernel per problem shape and keeps the most
  recent in a cache (1,024 by default). A token-budget batch has shapes of its own, and an
  epoch of Multi30k asks for several thousand kernels: with the default each is forgotten
  before the next epoch needs it again. Each kept kernel holds memory, so the capacity also
  bounds what a bf16 run's memory can grow to (docs/training.md).

A setting already in the environment wins over each of these.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from typing import Any

#: Spin iterations before a waiting OpenMP thread sleeps: microseconds.
SPIN_COUNT = "10000"
#: oneDNN kernels kept: more than an epoch of Multi30k's batch shapes needs.
PRIMITIVE_CACHE_CAPACITY = "16384"


def prepare(*, keep_heap: bool = False) -> None:
    """Set the thread wait and the kernel cache (before torch loads); with ``keep_heap``, keep
    freed memory in the heap (the commands that train or evaluate)."""
    if "OMP_WAIT_POLICY" not in os.environ:
        os.environ.setdefault("GOMP_SPINCOUNT", SPIN_COUNT)
    os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", PRIMITIVE_CACHE_CAPACITY)
    if keep_heap:
        from transformer_mt.cli.allocator import keep_freed_memory

        keep_freed_memory()


def command(name: str, *, keep_heap: bool = False) -> Callable[[], Any]:
    """The entry point of ``transformer-mt-NAME``: :func:`prepare`, then the ``main`` of
    ``transformer_mt.cli.NAME``, imported only then (torch with it)."""

    def run() -> Any:
        prepare(keep_heap=keep_heap)
        return importlib.import_module(f"transformer_mt.cli.{name}").main()

    run.__doc__ = f"``transformer-mt-{name}``"
    return run


train = command("train", keep_heap=True)
evaluate = command("evaluate", keep_heap=True)
translate = command("translate")
score = command("score")
export = command("export")
serve = command("serve")
