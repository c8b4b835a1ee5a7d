"""Checkpoint averaging, and finding the checkpoints of a run to average.

The paper's results come from such averages (Vaswani et al. 2017, section 6.1: the last 5
checkpoints of a base model, the last 20 of a big one). The result is a checkpoint of the one
format (:mod:`transformer_mt.checkpoint`), so ``evaluate.py`` and the translate command take it
as they take any other; it holds no training state, so it does not resume training.
"""

from __future__ import annotations

import copy
import logging
import math
import os
from pathlib import Path
from typing import Any

import torch

from transformer_mt.checkpoint import (
    CHECKPOINT_KEY,
    CheckpointError,
    build_model,
    load_checkpoint,
    metadata,
)

log = logging.getLogger(__name__)


def _add_to_sums(
    sums: dict[str, torch.Tensor],
    ckpt: dict[str, Any],
    p: str | os.PathLike[str],
    first_path: Path,
    first_meta: dict[str, Any],
) -> None:
    """Add one checkpoint's floating-point tensors to ``sums`` after checking it matches."""
    meta = metadata(ckpt, p)
    for key in ("model_config", "tokenizer"):
        if meta.get(key) != first_meta.get(key):
            raise CheckpointError(
                f"cannot average {p} with {first_path}: their {key.replace('_', ' ')}s "
                "differ; average checkpoints of one training run"
            )
    state = ckpt["state_dict"]
    if set(state) != set(sums):
        raise CheckpointError(
            f"cannot average {p} with {first_path}: different parameter names; average "
            "checkpoints of one training run"
        )
    for key, value in state.items():
        if value.is_floating_point():
            sums[key] += value.to(torch.float64)
        elif not torch.equal(value, sums[key]):
            raise CheckpointError(
                f"cannot average {p} with {first_path}: integer buffer {key} differs"
            )


def average_checkpoints(paths: list[str | os.PathLike[str]]) -> dict[str, Any]:
    """Average the parameters of several checkpoints of one model into a new checkpoint.

    Floating-point tensors are averaged (in float64, then cast back); integer buffers must be
    equal and are kept. Metadata (model config, tokenizer, languages, decoding, data) comes
    from the first checkpoint; training state (optimizer, loops, callbacks) is dropped, so the
    result evaluates and translates but does not resume training.

    Raises:
        CheckpointError: no paths, or checkpoints of different models or tokenizers.
    """
    if not paths:
        raise CheckpointError("no checkpoints to average; pass at least one")
    first_path = Path(paths[0])
    first = load_checkpoint(first_path)
    first_meta = metadata(first, first_path)
    build_model(first, first_path)  # validates the first checkpoint fully
    sums = {
        k: v.to(torch.float64) if v.is_floating_point() else v
        for k, v in first["state_dict"].items()
    }
    # (step, epoch) of each source: the average is dated by its latest one, both numbers alike.
    dates = [(first.get("global_step") or 0, first.get("epoch"))]
    for p in paths[1:]:
        ckpt = load_checkpoint(p)
        _add_to_sums(sums, ckpt, p, first_path, first_meta)
        dates.append((ckpt.get("global_step") or 0, ckpt.get("epoch")))
    n = len(paths)
    reference = first["state_dict"]
    averaged = {
        k: (v / n).to(reference[k].dtype) if v.is_floating_point() else v for k, v in sums.items()
    }
    latest = max(dates, key=lambda date: date[0])
    meta = copy.deepcopy(first_meta)
    meta.pop("torch_rng_state", None)  # resume state of one run; the average does not resume
    meta["averaged_from"] = [str(p) for p in paths]
    return {
        "state_dict": averaged,
        "global_step": latest[0],
        "epoch": latest[1],
        "hyper_parameters": copy.deepcopy(first.get("hyper_parameters", {})),
        "pytorch-lightning_version": first.get("pytorch-lightning_version"),
        CHECKPOINT_KEY: meta,
    }


def is_average(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` holds an average :func:`average_checkpoints` made (which a command may
    replace), rather than a run's checkpoint or another file (which it must not)."""
    try:
        meta = load_checkpoint(path).get(CHECKPOINT_KEY) or {}
    except CheckpointError:
        return False
    return "averaged_from" in meta


def stored_val_bleu(checkpoint: dict[str, Any]) -> float | None:
    """``val/bleu`` of this checkpoint as ModelCheckpoint recorded it (``current_score``).

    Lightning keys a callback's state by its class name and settings, so the training's
    ``SafeModelCheckpoint`` subclass is matched by the name it contains.
    """
    for key, state in (checkpoint.get("callbacks") or {}).items():
        if "ModelCheckpoint" in str(key) and isinstance(state, dict):
            if state.get("monitor") not in (None, "val/bleu"):
                continue
            score = state.get("current_score")
            if score is not None:
                value = float(score)
                return value if math.isfinite(value) else None
    return None
