"""The run directory: checked at start-up and held by one training run at a time.

Two runs in one directory would overwrite each other's files, so a run holds an OS lock on
``<run dir>/.run.lock`` (released by the kernel when the process dies) and writes its PID to
``.run.pid`` for the next one's message. :class:`RunDirGuard` checks in Hydra's
``on_run_start``, before Hydra writes ``.hydra/``; ``run()`` claims for multirun jobs and
direct callers. No torch, no Lightning: the check costs nothing at start-up.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout
from hydra.experimental.callback import Callback

from transformer_mt.errors import EXIT_USER_ERROR, UserError
from transformer_mt.files import write_text_atomic

log = logging.getLogger(__name__)

LOCK_NAME = ".run.lock"
PID_NAME = ".run.pid"
#: The start-up probe; removed on every path, full disk included.
PROBE_NAME = ".write_test"
PROBE_BYTES = 1 << 20  # 1 MiB: catches a full disk as well as permissions

_held: dict[str, FileLock] = {}


FIX = (
    "free some disk space, fix its permissions, or choose another directory with "
    "hydra.run.dir=PATH (or run_dir=PATH)"
)


def probe_writable(directory: Path, what: str = "the run directory") -> None:
    """Create ``directory`` and write (then remove) a 1 MiB file in it.

    Raises:
        OSError: one line with the directory, the cause and the fix; no probe file is left.
    """
    probe = directory / PROBE_NAME
    try:
        directory.mkdir(parents=True, exist_ok=True)
        try:
            with open(probe, "wb") as handle:
                handle.write(b"\0" * PROBE_BYTES)
                handle.flush()
                os.fsync(handle.fileno())
        finally:
            with contextlib.suppress(OSError):
                probe.unlink()
    except OSError as exc:
        raise OSError(f"cannot write to {what} {directory}: {exc.strerror or exc}; {FIX}") from None


def check_output_dir(run_dir: Path) -> None:
    """Fail at the start, not at the first save, when the run directory (and an existing
    ``checkpoints/`` in it) cannot be written."""
    probe_writable(run_dir)
    checkpoints = run_dir / "checkpoints"
    if checkpoints.exists():
        probe_writable(checkpoints, "the checkpoint directory")


def holder_pid(run_dir: Path) -> str:
    """The PID recorded by the run holding ``run_dir`` (``unknown`` if none was recorded)."""
    try:
        text = (run_dir / PID_NAME).read_text().strip()
    except OSError:
        return "unknown"
    return text if text.isdigit() else "unknown"


def _secondary_rank() -> bool:
    """A DDP worker process that Lightning started for another local rank of the same run."""
    return os.environ.get("LOCAL_RANK", "0") not in ("", "0")


def lock_run_dir(run_dir: Path) -> bool:
    """Hold ``run_dir`` for this process until :func:`release_run_dir` or exit.

    Returns:
        ``True`` if this call took the lock (the caller releases it), ``False`` if this
        process already held it (or is a secondary DDP rank, which shares rank 0's).

    Raises:
        UserError: another live process holds it (the message names its PID).
    """
    key = str(run_dir.resolve())
    if key in _held or _secondary_rank():
        return False
    lock = FileLock(str(run_dir / LOCK_NAME))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        raise UserError(
            f"the run directory {run_dir} is in use by another training run (PID "
            f"{holder_pid(run_dir)}, lock {run_dir / LOCK_NAME}); wait for it to finish, stop "
            "it, or choose another directory with hydra.run.dir=PATH"
        ) from None
    _held[key] = lock
    write_text_atomic(run_dir / PID_NAME, f"{os.getpid()}\n")
    return True


def release_run_dir(run_dir: Path) -> None:
    """Release the lock taken by :func:`lock_run_dir` (a no-op if this process holds none)."""
    lock = _held.pop(str(run_dir.resolve()), None)
    if lock is not None:
        with contextlib.suppress(OSError):
            (run_dir / PID_NAME).unlink()
        lock.release()


def claim_run_dir(run_dir: Path) -> bool:
    """Check and lock ``run_dir`` once per process (both raise user errors: one line, exit 2).

    Returns:
        ``True`` if this call took the lock (the caller releases it); ``False`` if this
        process already holds it, checked (or is a secondary DDP rank).
    """
    if str(run_dir.resolve()) in _held:
        return False
    check_output_dir(run_dir)
    return lock_run_dir(run_dir)


def check_not_another_run(run_dir: Path, ckpt_path: Any) -> None:
    """Refuse a directory that holds another run's checkpoints, unless this run resumes that
    one (``ckpt_path`` inside it, or Lightning's ``last``/``hpc``): Hydra would rewrite its
    ``.hydra/`` files and its log before any later check."""
    if not any((run_dir / "checkpoints").glob("*.ckpt")):
        return  # new, empty, or left by a run that saved nothing
    if ckpt_path and (
        str(ckpt_path) in ("last", "hpc")
        or run_dir.resolve() in Path(str(ckpt_path)).resolve().parents
    ):
        return
    raise UserError(
        f"hydra.run.dir={run_dir} holds the checkpoints of another run; resume that run with "
        f"ckpt_path={run_dir / 'checkpoints' / 'last.ckpt'}, or leave hydra.run.dir out (a new "
        "directory) or name one that holds no run"
    )


class RunDirGuard(Callback):
    """Hydra callback: check and lock ``hydra.run.dir`` before Hydra writes into it."""

    def on_run_start(self, config: Any, **kwargs: Any) -> None:
        from omegaconf import OmegaConf

        run_dir = Path(str(OmegaConf.select(config, "hydra.run.dir"))).absolute()
        try:
            check_not_another_run(run_dir, OmegaConf.select(config, "ckpt_path"))
            claim_run_dir(run_dir)
        except (OSError, UserError) as exc:
            # Hydra prints a traceback for anything raised here; say it in one line instead.
            sys.stdout.flush()
            print(f"error: {' '.join(str(exc).split())}", file=sys.stderr, flush=True)
            sys.exit(EXIT_USER_ERROR)

    def on_run_end(self, config: Any, **kwargs: Any) -> None:
        from omegaconf import OmegaConf

        release_run_dir(Path(str(OmegaConf.select(config, "hydra.run.dir"))).absolute())
