"""Checkpointing that survives kill -9, Ctrl-C and a diverging loss.

Two pieces, both wired in by :func:`transformer_mt.training.run.build` / ``configs/callbacks``:

- :class:`AtomicCheckpointIO` writes every checkpoint to a temporary file in the target
  directory, fsyncs it and renames it over the old one. Lightning's own save goes through
  an fsspec transaction whose temporary file lives in the system temp directory: when that
  is another file system (a tmpfs ``/tmp``, a scratch disk), the final step is a *copy*
  into ``last.ckpt``, and a kill during the copy leaves a truncated checkpoint (plus an
  orphaned multi-GB file in ``/tmp``). A rename within one directory is atomic.
- :class:`SafeModelCheckpoint` is Lightning's ``ModelCheckpoint`` that (a) saves a
  resumable checkpoint when training is interrupted (Ctrl-C, SIGTERM), (b) never writes
  weights that are NaN/inf, so after a diverging loss ``last.ckpt`` still holds the last
  good state, and (c) always leaves the final step in ``last.ckpt``.
"""

from __future__ import annotations

import logging
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.plugins.io import TorchCheckpointIO
from lightning.pytorch.utilities.exceptions import SIGTERMException

from transformer_mt.files import atomic_write

log = logging.getLogger(__name__)


class AtomicCheckpointIO(TorchCheckpointIO):
    """Save local checkpoints atomically: temp file in the same directory, fsync, os.replace.

    A reader (a resuming run, evaluate.py) sees either the previous complete file or the new
    complete file, never a partial one, whatever moment the process is killed. Remote paths
    (``s3://...``) fall back to Lightning's fsspec transaction.
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
        with atomic_write(str(path).removeprefix("file://")) as handle:
            torch.save(checkpoint, handle)


def is_interrupt(exc: BaseException) -> bool:
    """Ctrl-C or SIGTERM, also when cleanup code turned it into another exception.

    ``torch.save`` interrupted mid-write raises a ``RuntimeError`` from its zip writer's
    cleanup, with the ``KeyboardInterrupt`` only as its ``__context__``.
    """
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


class SafeModelCheckpoint(ModelCheckpoint):
    """``ModelCheckpoint`` that saves on interruption and refuses to save non-finite weights.

    Args:
        save_on_interrupt: Save a checkpoint (and ``last.ckpt`` with ``save_last``) when
            training stops on Ctrl-C or SIGTERM, so ``ckpt_path=.../last.ckpt`` resumes from
            the step reached. Other exceptions save nothing: after an error such as a
            non-finite loss the weights may be corrupt, and the previous checkpoint is the
            one to keep.
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
            # Ctrl-C can land between the step's checkpoint and its last.ckpt (or inside the
            # latter's write, which then leaves the old file): Lightning's "already saved at
            # this step" check would skip the save, leaving last.ckpt behind the step reached.
            self._last_global_step_saved = -1
        super().on_exception(trainer, pl_module, exception)

    def _save_last_checkpoint(self, trainer: pl.Trainer, monitor_candidates: Any) -> None:
        super()._save_last_checkpoint(trainer, monitor_candidates)
        if self._last_global_step_saved == trainer.global_step:  # written, not refused
            self._last_step_in_last = trainer.global_step

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Make ``last.ckpt`` hold the final step.

        Lightning writes ``last.ckpt`` at the end only when the run saved nothing else; with
        ``every_n_train_steps=N`` a finished (or resumed) run would otherwise end with a
        ``last.ckpt`` up to N-1 steps old.
        """
        super().on_train_end(trainer, pl_module)
        if self.save_last and not self._should_skip_saving_checkpoint(trainer):
            self._save_last_checkpoint(trainer, self._monitor_candidates(trainer))

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
