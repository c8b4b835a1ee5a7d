"""How OpenMP's threads wait between parallel regions: importing this module sets it, and
every command that runs torch (train, evaluate, serve) imports it before torch loads, since
OpenMP reads it only then.

Threads that spin for long (OpenMP's default) burn the core a descheduled sibling needs on a
busy CPU; threads that sleep at once (``OMP_WAIT_POLICY=PASSIVE``) are woken for every small
region, and a decoding step or a training step of a small model is many of them. A short spin
(GNU OpenMP's ``GOMP_SPINCOUNT``; the torch wheels use GNU OpenMP) keeps the threads awake
between the regions of one step, then lets them sleep (docs/benchmarks.md, "loop threads";
docs/serve.md, "Where a lone request's time goes"). A wait policy or spin count already in the
environment wins.
"""

from __future__ import annotations

import os

#: Spin iterations before a waiting thread sleeps: microseconds.
SPIN_COUNT = "10000"


def spin_briefly() -> None:
    """Set the short spin, unless the environment already says how threads wait."""
    if "OMP_WAIT_POLICY" not in os.environ:
        os.environ.setdefault("GOMP_SPINCOUNT", SPIN_COUNT)


spin_briefly()
