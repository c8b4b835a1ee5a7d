"""Test-only fault injection: a signal or a full disk at a known training step.

Fault tests must never race the machine's speed ("wait for a file, sleep, then signal"): a
slow machine finishes before the signal, a fast one is killed too early. :class:`FaultInjection`
makes the training process fault *itself* once N optimizer steps are done, so the outcome is
the same on every machine. It is enabled only from the command line::

    python train.py ... +callbacks.fault._target_=faults.FaultInjection \\
        +callbacks.fault.fault=SIGINT +callbacks.fault.at_step=7
"""

from __future__ import annotations

import errno
import logging
import os
import signal
from pathlib import Path
from typing import Any

import lightning.pytorch as pl

log = logging.getLogger(__name__)

FAULTS = ("SIGINT", "SIGTERM", "SIGKILL", "fill_disk")
PHASES = ("batch_start", "before_optimizer_step")


class FaultInjection(pl.Callback):
    """A fault at a known training step, never after a wall-clock sleep.

    Args:
        fault: ``SIGINT``, ``SIGTERM`` or ``SIGKILL`` (sent to this process), or
            ``fill_disk`` (write ``<run dir>/filler`` until the file system is full).
        at_step: fire in the first training hook that sees ``global_step == at_step``, i.e.
            once ``at_step`` optimizer steps are done and every checkpoint of that step is on
            disk.
        phase: ``batch_start`` (before the next step's forward pass) or
            ``before_optimizer_step`` (between backward and the update of step ``at_step + 1``:
            the middle of a step).
        filler: the file ``fill_disk`` writes.
    """

    def __init__(
        self,
        fault: str,
        at_step: int,
        phase: str = "batch_start",
        filler: str | None = None,
    ) -> None:
        if fault not in FAULTS:
            raise ValueError(
                "callbacks.fault.fault must be SIGINT, SIGTERM, SIGKILL or fill_disk, "
                f"got {fault!r}"
            )
        if phase not in PHASES:
            raise ValueError(
                f"callbacks.fault.phase must be batch_start or before_optimizer_step, got {phase!r}"
            )
        self.fault, self.at_step, self.phase, self.filler = fault, int(at_step), phase, filler
        self.fired = False

    def _fire(self, trainer: pl.Trainer, phase: str) -> None:
        if self.fired or phase != self.phase or trainer.global_step != self.at_step:
            return
        self.fired = True
        log.warning("fault injection: %s at step %d (%s)", self.fault, trainer.global_step, phase)
        if self.fault == "fill_disk":
            fill_disk(Path(self.filler or Path(trainer.default_root_dir) / "filler"))
        else:
            os.kill(os.getpid(), getattr(signal, self.fault))

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args: Any, **kwargs: Any
    ) -> None:
        self._fire(trainer, "batch_start")

    def on_before_optimizer_step(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: Any
    ) -> None:
        self._fire(trainer, "before_optimizer_step")


def fill_disk(path: Path, chunk: int = 1 << 20) -> None:
    """Write zeros to ``path`` until the file system reports ENOSPC (tests only)."""
    block = b"\0" * chunk
    with open(path, "wb", buffering=0) as handle:
        while True:
            try:
                handle.write(block)
            except OSError as exc:
                if exc.errno not in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT):
                    raise
                if len(block) == 1:
                    return
                block = block[: len(block) // 2]
