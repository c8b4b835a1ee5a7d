"""The machine's speed, measured before each trial of a study (``hydra.sweeper.host_check``).

Trials with a wall-clock budget measure the machine as much as the recipe, and a VM need not
show a slow spell. So a fixed fp32 matrix product is timed and stored before every trial, and
with ``min_ratio`` > 0 the worker waits while the machine is slower than that share of the
study's first measurement.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from transformer_mt import provenance

log = logging.getLogger(__name__)

#: The study attribute that holds its first measurement, the yardstick of every later one.
REFERENCE = "host_reference"
#: The trial attribute that holds the measurement taken before the trial.
TRIAL_ATTR = "host"


def cpu_model() -> str:
    """The CPU as ``lscpu`` names it, with its family and model numbers (the name alone does
    not tell generations apart)."""
    family, number = provenance.cpu_family(), provenance.cpu_model_number()
    return f"{provenance.cpu_model()} (family {family}, model {number})"


def matmul_gflops(size: int = 1024, repeats: int = 20) -> float:
    """Median fp32 GFLOP/s of ``repeats`` ``size`` x ``size`` products on torch's threads."""
    seconds = statistics.median(provenance.matmul_seconds(size, repeats))
    return 2 * size**3 / max(seconds, 1e-9) / 1e9


@dataclass
class HostSpeed:
    """One measurement before a trial, against the study's first."""

    gflops: float
    ratio: float  # gflops / the study's first measurement
    cpu: str
    waited_s: float = 0.0

    def attr(self) -> dict[str, Any]:
        """A JSON-safe mapping for a trial's user attributes."""
        out = asdict(self)
        out.update(
            gflops=round(self.gflops, 1), ratio=round(self.ratio, 3), waited_s=round(self.waited_s)
        )
        return out


@dataclass
class HostWait:
    """How long to wait for a slow machine: ``min_ratio`` 0 never waits."""

    min_ratio: float
    max_wait_s: float
    interval_s: float = 60.0
    sleep: Callable[[float], None] = time.sleep


def measure_until_fast(
    measure: Callable[[], float], reference: float, wait: HostWait
) -> tuple[float, float]:
    """Measure; while below ``wait.min_ratio`` of ``reference``, wait and measure again, for
    ``wait.max_wait_s`` at most. Returns the last measurement and the seconds slept."""
    slept = 0.0
    gflops = measure()
    while gflops < wait.min_ratio * reference:
        if slept >= wait.max_wait_s:
            log.warning(
                "the machine still runs at %.2fx the study's first measurement after %.0f s "
                "of waiting; the trial runs anyway, marked with its ratio",
                gflops / reference,
                slept,
            )
            break
        log.warning(
            "the machine runs at %.2fx the study's first measurement (%.0f against %.0f fp32 "
            "GFLOP/s, hydra.sweeper.host_check.min_ratio=%s): waiting %.0f s before the trial",
            gflops / reference,
            gflops,
            reference,
            wait.min_ratio,
            wait.interval_s,
        )
        wait.sleep(wait.interval_s)
        slept += wait.interval_s
        gflops = measure()
    return gflops, slept
