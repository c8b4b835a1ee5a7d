"""Checkpointing that survives kill -9, Ctrl-C and a diverging loss.

Wired in by :func:`transformer_mt.training.run.build` and ``configs/callbacks``; each class
says what it guards. The test-only fault hook lives in :mod:`faults`.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import shutil
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import EMAWeightAveraging, ModelCheckpoint
from lightning.pytorch.plugins.io import TorchCheckpointIO
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities.exceptions import SIGTERMException

from transformer_mt.checkpoint import save_checkpoint
from transformer_mt.errors import NonFiniteLossError

log = logging.getLogger(__name__)


class AtomicCheckpointIO(TorchCheckpointIO):
    """Save local checkpoints atomically: temp file in the same directory, fsync, os.replace.

    Lightning's fsspec transaction stages in the system temp directory, and a copy across file
    systems can be torn by a kill. Remote paths (``s3://...``) still use it.
    """

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None
    ) -> None:
        """Write ``checkpoint`` to ``path`` atomically."""
        if "://" in str(path) and not str(path).startswith("file://"):
            super().save_checkpoint(checkpoint, path, storage_options)
            return
        if storage_options is not None:
            raise TypeError(f"{type(self).__name__} does not take storage_options")
        target = Path(str(path).removeprefix("file://"))
        try:
            save_checkpoint(checkpoint, target)  # the one checkpoint writer (atomic, fsync)
        except (OSError, RuntimeError) as exc:
            # torch.save's zip writer reports a failed write as a RuntimeError ("unexpected
            # pos ..."); the previous checkpoint is in place and the temp file gone.
            if isinstance(exc, RuntimeError) and not _is_write_failure(exc):
                raise
            raise checkpoint_write_error(target, exc) from exc


def _is_write_failure(exc: BaseException) -> bool:
    """A RuntimeError of torch's zip writer caused by a failed write (full disk, quota)."""
    text = str(exc)
    if any(word in text for word in ("unexpected pos", "file write failed", "write failed")):
        return True
    context = exc.__context__
    return isinstance(context, OSError)


def _nearly_full(directory: Path) -> bool:
    try:
        return shutil.disk_usage(directory).free < 2**20
    except OSError:
        return False


def checkpoint_write_error(target: Path, exc: BaseException) -> OSError:
    """The one-line error for a checkpoint that could not be written (disk full, permissions)."""
    directory = target.parent
    try:
        free = f"{shutil.disk_usage(directory).free / 2**20:.1f} MiB free"
    except OSError:
        free = "free space unknown"
    code = next(
        (e.errno for e in (exc, exc.__context__, exc.__cause__) if isinstance(e, OSError)),
        None,
    )
    if code is None and _nearly_full(directory):
        code = errno.ENOSPC  # torch's zip writer reports a failed write without its errno
    reason = os.strerror(code) if code else str(exc).splitlines()[0]
    return OSError(
        f"cannot write checkpoint {target}: {reason} ({free} in {directory}); the previous "
        "checkpoints are intact and no temporary file was left; free some disk space (or "
        "lower callbacks.*.save_top_k) and resume from the last checkpoint",
    )


def is_interrupt(exc: BaseException) -> bool:
    """Ctrl-C or SIGTERM, also as the ``__context__`` of another exception (``torch.save``
    interrupted mid-write raises a ``RuntimeError``)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, (KeyboardInterrupt, SIGTERMException)):
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False


def weights_are_finite(module: torch.nn.Module) -> bool:
    """True when no parameter or buffer of ``module`` holds NaN or inf."""
    tensors = [*module.parameters(), *module.buffers()]
    return all(bool(torch.isfinite(t).all()) for t in tensors if t.is_floating_point())


#: ``module.nonfinite_loss=skip`` gives up after this many non-finite batches in a row.
MAX_SKIPPED_IN_A_ROW = 10


def stop_if_diverged(model: torch.nn.Module, loss: torch.Tensor, step: int, in_a_row: int) -> None:
    """``nonfinite_loss=skip``: raise once skipping cannot recover (the model has diverged),
    rather than skip every later batch and end "successfully" with a useless model.

    Raises:
        NonFiniteLossError: the weights are not finite, or ``in_a_row`` reached
            :data:`MAX_SKIPPED_IN_A_ROW`.
    """
    diverged = not weights_are_finite(model)
    if not diverged and in_a_row < MAX_SKIPPED_IN_A_ROW:
        return
    why = (
        "the weights themselves are NaN/inf"
        if diverged
        else f"{in_a_row} batches in a row were non-finite"
    )
    raise NonFiniteLossError(
        f"training loss became {loss.item()} at step {step} and {why}, so "
        "module.nonfinite_loss=skip cannot recover; lower optimizer.lr (or raise warmup_steps, "
        "or use bf16-mixed or 32-true instead of fp16) and resume from the last good checkpoint"
    )


class SafeModelCheckpoint(ModelCheckpoint):
    """``ModelCheckpoint`` that saves on interruption, refuses non-finite weights and always
    leaves the final step in ``last.ckpt``.

    Args:
        save_on_interrupt: Save (and ``last.ckpt`` with ``save_last``) on Ctrl-C or SIGTERM.
            Other exceptions save nothing: the weights may be corrupt.
        **kwargs: ``ModelCheckpoint`` arguments.
    """

    def __init__(self, *, save_on_interrupt: bool = True, **kwargs: Any) -> None:
        kwargs.pop("save_on_exception", None)  # replaced by save_on_interrupt
        super().__init__(save_on_exception=save_on_interrupt, **kwargs)
        self._last_step_in_last = -1  # global step held by last.ckpt, once this run wrote it

    def on_exception(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException
    ) -> None:
        """Save only for an interruption; never for an error (weights may be corrupt)."""
        if not is_interrupt(exception):
            return
        if self.save_last and self._last_step_in_last != trainer.global_step:
            # Ctrl-C can land between the step's checkpoint and its last.ckpt; Lightning's
            # "already saved at this step" check would then leave last.ckpt behind.
            self._last_global_step_saved = -1
        super().on_exception(trainer, pl_module, exception)

    def _save_last_checkpoint(self, trainer: pl.Trainer, monitor_candidates: Any) -> None:
        super()._save_last_checkpoint(trainer, monitor_candidates)
        if self._last_global_step_saved == trainer.global_step:  # written, not refused
            self._last_step_in_last = trainer.global_step

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Make ``last.ckpt`` hold the final step (Lightning's may be up to N-1 steps old with
        ``every_n_train_steps=N``)."""
        super().on_train_end(trainer, pl_module)
        if self.save_last and not self._should_skip_saving_checkpoint(trainer):
            self._save_last_checkpoint(trainer, self._monitor_candidates(trainer))

    def _save_topk_checkpoint(self, trainer: pl.Trainer, monitor_candidates: Any) -> None:
        # Before the first validation there is nothing to rank by: keep last.ckpt, quietly.
        unranked = self.monitor is not None and self.monitor not in monitor_candidates
        if unranked and not trainer.fit_loop.epoch_loop.val_loop._has_run:
            return
        super()._save_topk_checkpoint(trainer, monitor_candidates)

    def _save_checkpoint(self, trainer: pl.Trainer, filepath: str) -> None:
        if not weights_are_finite(trainer.lightning_module):
            log.warning(
                "not saving %s at step %d: the weights contain NaN/inf; the previous checkpoint "
                "is kept",
                filepath,
                trainer.global_step,
            )
            return
        super()._save_checkpoint(trainer, filepath)


class WeightEMA(EMAWeightAveraging):
    """An exponential moving average of the weights, which validation, test and checkpoints use.

    Lightning's callback writes the average as ``state_dict`` and the raw weights as
    ``current_model_state`` (for resuming). Outside fitting it would load the raw weights, or
    swap in the fit's last average; this one leaves the checkpoint's ``state_dict`` in place.
    """

    def on_load_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        """Restore average and raw weights when fitting; otherwise keep ``state_dict``'s."""
        if trainer.state.fn == TrainerFn.FITTING:
            super().on_load_checkpoint(trainer, pl_module, checkpoint)

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        """After fitting (the model now holds the average), no more swaps for validate/test."""
        if stage == "fit":
            self._average_model = None


#: Signals that stop training at the end of the current step.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StopAtStepBoundary(pl.Callback):
    """Ctrl-C / SIGTERM stop training at the end of the current step (or validation batch).

    A ``KeyboardInterrupt`` mid-step would save an RNG state and loop position that a resume
    cannot reproduce. The signal is only recorded, and raised from ``on_train_batch_end``,
    where regular checkpoints are written, so a resume is bit-identical. A second Ctrl-C
    interrupts at once; Lightning's own SIGTERM handler still runs.
    """

    def __init__(self) -> None:
        self.requested: str | None = None

    def _handler(self, signum: int, frame: Any) -> None:
        name = signal.Signals(signum).name
        if self.requested is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt  # a second Ctrl-C: stop now
        if self.requested is None:
            log.warning(
                "%s received: stopping at the end of this training step (Ctrl-C again to stop "
                "at once)",
                name,
            )
        self.requested = name

    @contextlib.contextmanager
    def handling_signals(self) -> Iterator[None]:
        """Install the handlers around ``trainer.fit`` (main thread only), then restore them.

        Around, not inside: Lightning restores the handlers it found at fit start, so ones
        installed by a hook would outlive fit.
        """
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        self.requested = None
        previous = {signum: signal.signal(signum, self._handler) for signum in STOP_SIGNALS}
        try:
            yield
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler if handler is not None else signal.SIG_DFL)

    def _stop_if_requested(self) -> None:
        if self.requested is not None:
            raise KeyboardInterrupt(f"{self.requested} received")

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args: Any, **kwargs: Any
    ) -> None:
        if self.requested is not None:
            # The stop skips the hooks that write the step's logs: write them first.
            pl_module.on_train_batch_end(*args, **kwargs)
            trainer._logger_connector.on_batch_end()
            trainer._logger_connector.update_train_step_metrics()
        self._stop_if_requested()

    def on_validation_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args: Any, **kwargs: Any
    ) -> None:
        if not trainer.sanity_checking:
            self._stop_if_requested()


class KeepValidationClock(pl.Callback):
    """A time-based ``trainer.val_check_interval`` that counts across training-loader reloads.

    Lightning restarts its validation clock at each loader setup, so epochs shorter than the
    interval would never validate. Uses Lightning's private ``_last_val_time`` (a test holds it).
    """

    def __init__(self) -> None:
        self._last_val_time: float | None = None

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._last_val_time = getattr(trainer, "_last_val_time", None)

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        timed = getattr(trainer, "_val_check_time_interval", None) is not None
        if timed and self._last_val_time is not None:
            trainer._last_val_time = self._last_val_time
