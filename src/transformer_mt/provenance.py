"""Where a number came from: the machine, the code and the command of a run.

A figure holds for its machine, so every training run writes ``run_info.json`` into its run
directory when it starts (one entry per start: a resumed run adds one), and the result records
under ``docs/runs/`` (``scripts/record_run.py``) carry the same facts beside the metrics.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

from transformer_mt.files import write_text_atomic

RUN_INFO = "run_info.json"


CPUINFO = Path("/proc/cpuinfo")

#: The vector and matrix units that decide a CPU's speed here (``/proc/cpuinfo`` flags): one
#: family number covers CPUs with and without AVX-512 (AMD's family 25 is Zen 3 and Zen 4).
CPU_UNITS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_bf16", "amx_int8")


def _cpuinfo(field: str, path: Path | None = None) -> str | None:
    with contextlib.suppress(OSError), open(path or CPUINFO) as f:
        for line in f:
            if line.split(":", 1)[0].strip() == field:
                return line.split(":", 1)[1].strip()
    return None


def cpu_model() -> str:
    """The CPU model string (what ``lscpu | grep 'Model name'`` prints)."""
    return _cpuinfo("model name") or platform.processor() or "unknown"


def cpu_family() -> int | None:
    """The CPU family number (``lscpu``'s "CPU family"); ``None`` where it is not known."""
    family = _cpuinfo("cpu family")
    return int(family) if family and family.isdigit() else None


def cpu_model_number(path: Path | None = None) -> int | None:
    """The CPU model number (``lscpu``'s "Model"), which tells the generations of one family
    apart; ``None`` where it is not known."""
    number = _cpuinfo("model", path)
    return int(number) if number and number.isdigit() else None


def matmul_seconds(size: int = 1024, repeats: int = 20, warmup: int = 3) -> list[float]:
    """Seconds of each of ``repeats`` fp32 ``size`` x ``size`` products on torch's threads.

    One fixed piece of arithmetic, timed after ``warmup`` untimed products (allocation, thread
    start-up): the machine's speed of the moment, for a benchmark's table or a sweep's trial.
    """
    generator = torch.Generator().manual_seed(0)
    a = torch.randn(size, size, generator=generator)
    b = torch.randn(size, size, generator=generator)
    for _ in range(warmup):
        a @ b
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - start)
    return times


def cpu_units(path: Path | None = None) -> list[str]:
    """Which of :data:`CPU_UNITS` the CPU has (empty where ``/proc/cpuinfo`` is missing)."""
    flags = set((_cpuinfo("flags", path) or "").split())
    return [unit for unit in CPU_UNITS if unit in flags]


def source_version(where: Path | None = None) -> dict[str, Any]:
    """The git commit of the code that runs, and whether tracked files differ from it.

    ``None`` values where the package is not a git checkout (an installed wheel).
    """
    where = where or Path(__file__).resolve().parent

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(
                ["git", "-C", str(where), *args], capture_output=True, text=True, timeout=10
            )
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    changed = git("status", "--porcelain", "--untracked-files=no") if commit else None
    return {"commit": commit, "dirty": None if changed is None else bool(changed)}


def machine() -> dict[str, Any]:
    """CPU, threads, load and versions at this moment."""
    return {
        "cpu": cpu_model(),
        "cpu_family": cpu_family(),
        "cpu_model_number": cpu_model_number(),
        "cpu_units": cpu_units(),
        "cpu_count": os.cpu_count(),
        "threads": torch.get_num_threads(),
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "torch": torch.__version__,
        "python": platform.python_version(),
    }


def peak_resident_bytes() -> int | None:
    """The most memory this process has held resident so far; None where the OS cannot say.

    A run's memory depends on its precision as much as on its model (bf16 products on a CPU
    keep a compiled kernel per shape: ``cli/entry.py``), so the training summary shows it.
    """
    try:
        import resource
    except ImportError:  # Windows has no getrusage
        return None
    peak = int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
    return peak if sys.platform == "darwin" else peak * 1024  # macOS counts bytes, Linux KiB


def write_run_info(run_dir: Path, overrides: list[str] | None = None) -> dict[str, Any]:
    """Add this start of a run (time, command, code, machine) to ``run_dir/run_info.json``."""
    path = run_dir / RUN_INFO
    parts: list[dict[str, Any]] = []
    if path.is_file():
        with contextlib.suppress(OSError, ValueError):
            loaded = json.loads(path.read_text(encoding="utf-8"))
            parts = list(loaded.get("starts", [])) if isinstance(loaded, dict) else []
    start = {
        "time": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
        "argv": list(sys.argv),
        "overrides": list(overrides or []),
        "source": source_version(),
        "machine": machine(),
    }
    parts.append(start)
    run_dir.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, json.dumps({"starts": parts}, indent=2) + "\n")
    return start
