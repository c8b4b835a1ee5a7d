"""``average_last=N``: the run's result is the average of its last N epoch checkpoints.

Averaging the last checkpoints (Vaswani et al. 2017, section 6.1) smooths out the noise of
the final steps. ``checkpoints/average-lastN.ckpt`` is validated (its metrics are the run's
``optimized_metric``), tested in place of the best checkpoint and named in the summary. The
inputs are ``callbacks.recent_checkpoints``' ``recent-*.ckpt`` files.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

from transformer_mt.checkpoint import (
    CheckpointError,
    save_checkpoint,
)
from transformer_mt.errors import UserError
from transformer_mt.inference.averaging import average_checkpoints, is_average

log = logging.getLogger(__name__)

_STEP = re.compile(r"step(\d+)")


def average_path(run_dir: Path, n: int) -> Path:
    return run_dir / "checkpoints" / f"average-last{n}.ckpt"


def check_average_last(n: int, callbacks: dict[str, Any]) -> None:
    """Refuse, before any training, an ``average_last`` the kept checkpoints cannot give.

    Raises:
        UserError: ``n < 0``, or ``callbacks.recent_checkpoints`` missing or keeping fewer.
    """
    if n < 0:
        raise UserError(f"average_last must be >= 0 (0: no average), got {n}")
    if n == 0:
        return
    recent = callbacks.get("recent_checkpoints") or {}
    keep = recent.get("save_top_k", 1)
    if not recent or (keep != -1 and keep < n):
        have = "none are kept" if not recent else f"save_top_k is {keep}"
        raise UserError(
            f"average_last={n} needs the last {n} checkpoints, but {have}; set "
            f"callbacks.recent_checkpoints.save_top_k={n} (callbacks=default keeps them), "
            "or lower average_last"
        )


def write_average(run_dir: Path, n: int) -> Path:
    """Average the ``n`` latest ``recent-*.ckpt`` of ``run_dir`` into ``average-lastN.ckpt``.

    An existing file there is replaced only if it is an average (an earlier part of this run).

    Raises:
        CheckpointError: no recent checkpoints, or the target is not an average.
    """
    folder = run_dir / "checkpoints"
    recent = []
    for path in folder.glob("recent-*.ckpt"):
        match = _STEP.search(path.name)
        if match:
            recent.append((int(match.group(1)), path))
    if not recent:
        raise CheckpointError(f"no recent-*.ckpt in {folder} to average")
    chosen = [path for _, path in sorted(recent)[-n:]]
    if len(chosen) < n:
        log.warning(
            "average_last=%d: the run saved %d checkpoints; averaging those", n, len(chosen)
        )
    target = average_path(run_dir, n)
    if target.exists() and not is_average(target):
        raise CheckpointError(
            f"{target} exists and is not an average of checkpoints; move it away or "
            "choose another run directory"
        )
    save_checkpoint(average_checkpoints(chosen), target)
    log.info("averaged %d checkpoints into %s", len(chosen), target)
    return target
