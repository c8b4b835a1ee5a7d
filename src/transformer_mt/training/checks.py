"""Start-up checks of a training run: what can be found before any data is read or step trained.

Each raises a user error naming the value, the cause and the fix (docs/errors.md); the run
directory's own checks are in :mod:`transformer_mt.training.rundir`.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from transformer_mt.checkpoint import LoadedModel, build_model, load_checkpoint
from transformer_mt.data.tokenizer import Tokenizer
from transformer_mt.errors import UserError
from transformer_mt.model.transformer import ModelConfig


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


def check_resume_checkpoint(ckpt_path: Any) -> LoadedModel | None:
    """Read the checkpoint to resume from, before anything else: a bad file is a one-line
    :class:`CheckpointError` here, not a traceback from deep inside Lightning."""
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
    return loaded


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
