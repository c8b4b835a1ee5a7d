"""Start-up checks of a training run: what can be found before any data is read or step trained.

Each raises a user error naming the value, the cause and the fix (docs/errors.md); the run
directory's own checks are in :mod:`transformer_mt.training.rundir`.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, get_args

from lightning.fabric.connector import _PRECISION_INPUT

from transformer_mt.checkpoint import LoadedModel, build_model, load_checkpoint
from transformer_mt.data.tokenizer import Tokenizer
from transformer_mt.errors import UserError
from transformer_mt.model.transformer import ModelConfig
from transformer_mt.training.budget import validation_interval
from transformer_mt.training.config import model_settings


def check_max_len(data_max_len: int | None, model_max_len: int) -> None:
    """A sentence of ``data.max_len`` tokens plus ``<bos>``/``<eos>`` must fit the model's
    positional table (longer pairs are dropped or truncated to ``data.max_len``)."""
    if data_max_len is None:
        return
    needed = int(data_max_len) + 1
    if needed > model_max_len:
        raise UserError(
            f"data.max_len={data_max_len} does not fit model.max_len={model_max_len}: a "
            f"sentence of data.max_len tokens plus <bos>/<eos> takes {needed} positions; set "
            f"data.max_len={model_max_len - 1} (or lower), or model.max_len={needed}"
        )


def check_settings(cfg: Any) -> None:
    """What the config alone decides, checked before any data is read (a :class:`TrainSchema`):
    the model's shape (unless ``init_from`` brings one), the wall-clock budget, the precision.

    Raises:
        ValueError, UserError: the setting, the cause and the fix.
    """
    if not cfg.init_from:  # the tokenizer's sizes come later; no check here depends on them
        sizes = {"src_vocab_size": 64, "tgt_vocab_size": 64, "pad_id": 0}
        ModelConfig.from_dict(model_settings(cfg.model) | sizes)
    max_time, validations = cfg.trainer.get("max_time"), cfg.budget.validations
    if max_time is not None or validations:
        validation_interval(max_time, validations or 1)
    precision = cfg.trainer.get("precision")
    allowed = [str(v) for kind in get_args(_PRECISION_INPUT) for v in get_args(kind)]
    if precision is not None and str(precision) not in ("auto", *allowed):
        raise UserError(
            f"trainer.precision={precision} is not a precision; use auto (the fastest on this "
            f"machine) or one of {', '.join(allowed)}"
        )


def check_resume_checkpoint(ckpt_path: Any, callbacks: dict[str, Any]) -> LoadedModel | None:
    """Read the checkpoint to resume from, before anything else: a bad file is a one-line
    :class:`CheckpointError` here, not a traceback from deep inside Lightning. A run that
    averaged its weights resumes only with its average (``callbacks``: the configured ones)."""
    if not ckpt_path or str(ckpt_path) in ("last", "best", "hpc"):
        return None  # Lightning's own shorthands: it finds the file itself
    path = Path(str(ckpt_path))
    checkpoint = load_checkpoint(path)
    loaded = build_model(checkpoint, path)  # first: a file that is not ours says so
    if "optimizer_states" not in checkpoint:
        raise UserError(
            f"cannot resume from {path}: it holds no optimizer state (an averaged or exported "
            f"checkpoint has only weights); start a run from its weights with init_from={path} "
            "instead of ckpt_path="
        )
    if "current_model_state" in checkpoint and not _averages_weights(callbacks):
        # Without the callback, training would go on from the average and drop the raw weights.
        raise UserError(
            f"cannot resume from {path} without its weight average: the run trained with "
            "callbacks=ema; add callbacks=ema to resume it"
        )
    return loaded


def _averages_weights(callbacks: dict[str, Any]) -> bool:
    """Whether a configured callback is a Lightning weight averaging (EMA)."""
    from hydra.utils import get_class
    from lightning.pytorch.callbacks import WeightAveraging

    targets = [node.get("_target_") for node in callbacks.values() if isinstance(node, dict)]
    return any(t and issubclass(get_class(t), WeightAveraging) for t in targets)


def _vocabularies(tokenizer: Tokenizer) -> tuple[dict[str, int], dict[str, int]]:
    return tokenizer.src.get_vocab(), tokenizer.tgt.get_vocab()


def check_resume_matches(
    resumed: LoadedModel, tokenizer: Tokenizer, model_config: ModelConfig, run_dir: Path
) -> None:
    """The checkpoint to resume from was trained with this run's tokenizer (same subwords,
    not only the same size) and model shape."""
    path = resumed.path
    theirs, ours = resumed.tokenizer, tokenizer
    sizes = (
        (theirs.src_vocab_size, theirs.tgt_vocab_size),
        (ours.src_vocab_size, ours.tgt_vocab_size),
    )
    if sizes[0] != sizes[1] or _vocabularies(theirs) != _vocabularies(ours):
        how = (
            f"vocabulary {sizes[0][0]}/{sizes[0][1]} (src/tgt) vs this run's "
            f"{sizes[1][0]}/{sizes[1][1]}"
            if sizes[0] != sizes[1]
            else f"the same size ({sizes[1][0]}) but different subwords"
        )
        raise UserError(
            f"cannot resume from {path}: it was trained with another tokenizer than this run's "
            f"({how}; this run's is {run_dir}/tokenizer.json); resume with the data settings "
            "of the original run (same data.dir, data.vocab_size, ...) or copy the original "
            f"run's tokenizer files into {run_dir}"
        )
    mine, saved = model_config.to_dict(), resumed.config.to_dict()
    differ = [
        f"model.{k}={saved[k]!r} (this run: {mine.get(k)!r})"
        for k in saved
        if saved[k] != mine.get(k)
    ]
    if differ:
        raise UserError(
            f"cannot resume from {path}: it holds a different model, {', '.join(differ)}; "
            "resume with the model settings of the original run"
        )


def check_free_space(run_dir: Path, module: Any, callbacks: list[Any]) -> None:
    """Fail at start-up when the checkpoints this run keeps cannot fit on the disk: each is
    3 x the parameter bytes (weights, two Adam moments; 4 x with EMA), ``save_top_k`` (+ last)
    files plus one temporary."""
    from lightning.pytorch.callbacks import ModelCheckpoint, WeightAveraging

    copies = 4 if any(isinstance(cb, WeightAveraging) for cb in callbacks) else 3
    per_file = copies * sum(p.numel() * p.element_size() for p in module.parameters())
    count = 1  # the temporary file of a save
    for cb in callbacks:
        if isinstance(cb, ModelCheckpoint):
            if cb.save_top_k < 0:
                return  # keeps every checkpoint: no bound to check against
            count += cb.save_top_k + (1 if cb.save_last else 0)
    needed = per_file * count
    free = shutil.disk_usage(run_dir).free
    if free < needed:
        raise OSError(
            f"not enough disk space for the checkpoints of this run in {run_dir}: {count} "
            f"files of ~{per_file / 2**20:.1f} MiB need ~{needed / 2**20:.0f} MiB, "
            f"{free / 2**20:.0f} MiB are free; free some disk space, keep fewer checkpoints "
            "(callbacks.model_checkpoint.save_top_k, callbacks.recent_checkpoints.save_top_k) "
            "or choose another directory with hydra.run.dir=PATH"
        )
