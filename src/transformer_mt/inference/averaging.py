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
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from transformer_mt.checkpoint import (
    CHECKPOINT_KEY,
    CheckpointError,
    CheckpointNotFoundError,
    build_model,
    load_checkpoint,
    metadata,
)

log = logging.getLogger(__name__)

_STEP_RE = re.compile(r"step[=_-]?(\d+)")
_BLEU_RE = re.compile(r"bleu[=_-]?(\d+(?:\.\d+)?)")


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


@dataclass
class CheckpointInfo:
    """A checkpoint file of a run with its step and validation score (``None`` if unknown)."""

    path: Path
    step: int | None
    score: float | None


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


def run_checkpoints(run_dir: str | os.PathLike[str]) -> list[CheckpointInfo]:
    """The checkpoints of a run directory (``<run_dir>/checkpoints/*.ckpt`` or ``*.ckpt``).

    The step and val/bleu come from the file name (``...-step000120-bleu12.34.ckpt``); where
    the name lacks them, from the checkpoint itself (``global_step`` and the ModelCheckpoint
    callback state). ``last.ckpt`` is skipped when another file holds the same step.
    """
    run_dir = Path(run_dir)
    folder = run_dir / "checkpoints" if (run_dir / "checkpoints").is_dir() else run_dir
    if not folder.is_dir():
        raise CheckpointNotFoundError(
            f"run directory {run_dir} does not exist; pass the directory train.py wrote "
            "(it holds checkpoints/)"
        )
    infos: list[CheckpointInfo] = []
    for path in sorted(folder.glob("*.ckpt")):
        step_match, bleu_match = _STEP_RE.search(path.name), _BLEU_RE.search(path.name)
        step = int(step_match.group(1)) if step_match else None
        score = float(bleu_match.group(1)) if bleu_match else None
        if step is None or score is None:
            checkpoint = load_checkpoint(path)
            if step is None and checkpoint.get("global_step") is not None:
                step = int(checkpoint["global_step"])
            if score is None:
                score = stored_val_bleu(checkpoint)
        infos.append(CheckpointInfo(path, step, score))
    # One file per step: last.ckpt and the "best" and "recent" callbacks may save one step
    # twice; prefer a named file, and one whose score is known.
    unique: dict[Any, CheckpointInfo] = {}
    for info in sorted(infos, key=lambda i: (i.path.name == "last.ckpt", i.score is None)):
        unique.setdefault(info.step if info.step is not None else info.path, info)
    infos = sorted(unique.values(), key=lambda i: (i.step or 0, i.path.name))
    if not infos:
        raise CheckpointNotFoundError(
            f"no .ckpt files in {folder}; train first (python train.py) or pass another run"
        )
    return infos


#: The callback that keeps the checkpoints each mode reads: the best by val/bleu, the latest.
_KEEP_OPTION = {
    "best": "callbacks.model_checkpoint.save_top_k",
    "last": "callbacks.recent_checkpoints.save_top_k",
}


def select_checkpoints(run_dir: str | os.PathLike[str], n: int, mode: str = "last") -> list[Path]:
    """The ``n`` latest (``mode="last"``, by step) or best (``"best"``, by val/bleu) checkpoints.

    Raises:
        CheckpointError: ``n`` < 1, an unknown mode, or fewer than ``n`` usable checkpoints.
    """
    if n < 1:
        raise CheckpointError(f"number of checkpoints to average must be >= 1, got {n}")
    if mode not in ("last", "best"):
        raise CheckpointError(f"mode must be 'last' or 'best', got {mode!r}")
    infos = run_checkpoints(run_dir)
    key_name = "step" if mode == "last" else "score"
    usable = [i for i in infos if getattr(i, key_name) is not None]
    if len(usable) < n:
        raise CheckpointError(
            f"{run_dir} has {len(usable)} checkpoints with a known {key_name} "
            f"({', '.join(i.path.name for i in usable) or 'none'}), fewer than the {n} asked "
            f"for; ask for fewer, or train with {_KEEP_OPTION[mode]}=N"
        )
    usable.sort(key=lambda i: (getattr(i, key_name), i.step or 0), reverse=True)
    chosen = usable[:n]
    log.info("averaging the %s %d: %s", mode, n, ", ".join(f"{i.path.name}" for i in chosen))
    return [i.path for i in chosen]
