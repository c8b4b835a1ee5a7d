"""Checkpoints: safe loading, rebuilding a model from one file, and averaging.

A checkpoint is a file from a stranger. Every load in this project goes through
:func:`load_checkpoint`, which calls ``torch.load(weights_only=True)``: tensors and plain
containers only, so a crafted file cannot run code while it is read. Everything needed to
translate (model config, tokenizer, languages, decoding options) sits in the checkpoint under
``"transformer_mt"`` as plain types (see ``TranslationModule.on_save_checkpoint``).

Errors are :class:`CheckpointError` (a ``ValueError``) with one line that names the file, the
cause and the fix.
"""

from __future__ import annotations

import copy
import logging
import math
import os
import pickle
import re
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from transformer_mt.data.tokenizer import Tokenizer
from transformer_mt.files import atomic_write
from transformer_mt.model.transformer import ModelConfig, Transformer

log = logging.getLogger(__name__)

#: Key of this project's metadata inside a Lightning checkpoint, and its format version.
CHECKPOINT_KEY = "transformer_mt"
CHECKPOINT_FORMAT = 1
#: Lightning prefixes the model's parameter names with the module attribute name.
STATE_PREFIX = "model."

_STEP_RE = re.compile(r"step[=_-]?(\d+)")
_BLEU_RE = re.compile(r"bleu[=_-]?(\d+(?:\.\d+)?)")


class CheckpointError(ValueError):
    """A checkpoint cannot be used; the message says why and what to do."""


class CheckpointNotFoundError(CheckpointError, FileNotFoundError):
    """The checkpoint path does not exist."""


class UnsafeCheckpointError(CheckpointError):
    """The file holds pickled Python objects that ``weights_only`` loading refuses."""


def load_checkpoint(path: str | os.PathLike[str], map_location: Any = "cpu") -> dict[str, Any]:
    """Read a checkpoint file safely: ``torch.load(weights_only=True)``, nothing else.

    Args:
        path: a ``.ckpt`` file written by Lightning (``train.py``) or
            :func:`save_checkpoint`.
        map_location: where tensors go (``"cpu"`` by default; move the model afterwards).

    Returns:
        The checkpoint dictionary.

    Raises:
        CheckpointNotFoundError: no file at ``path``.
        UnsafeCheckpointError: the file contains objects that would run code when unpickled.
        CheckpointError: not a checkpoint, or truncated/corrupted.
    """
    path = Path(path)
    if path.is_dir():
        candidates = sorted(p.name for p in path.glob("**/*.ckpt"))[:5]
        hint = f" (it holds {', '.join(candidates)})" if candidates else ""
        raise CheckpointNotFoundError(
            f"checkpoint path {path} is a directory{hint}; pass a file such as "
            f"{path / 'checkpoints' / 'last.ckpt'}"
        )
    if not path.is_file():
        raise CheckpointNotFoundError(
            f"checkpoint {path} does not exist; pass the path of a .ckpt file written by "
            "train.py, e.g. outputs/<task>/runs/<time>/checkpoints/last.ckpt"
        )
    try:
        checkpoint = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as err:
        text = str(err)
        if "GLOBAL" in text:  # a reference to a Python callable: what code execution needs
            found = re.search(r"GLOBAL ([\w.]+)", text)
            what = f" ({found.group(1)})" if found else ""
            raise UnsafeCheckpointError(
                f"refusing to load {path}: it contains pickled Python objects{what} that could "
                "run code when loaded; it was not written by train.py. Use a checkpoint from "
                "train.py or scripts/average_checkpoints.py"
            ) from None
        raise _not_a_checkpoint(path, err) from None
    except RuntimeError as err:
        if "zip archive" in str(err) or "central directory" in str(err):
            raise CheckpointError(
                f"checkpoint {path} is truncated or corrupted ({_first_line(err)}); it was "
                "probably not completely written or copied: copy it again or use another "
                "checkpoint of the run (e.g. last.ckpt)"
            ) from None
        raise _not_a_checkpoint(path, err) from None
    except EOFError:
        raise CheckpointError(
            f"checkpoint {path} is empty or truncated; copy it again or use another checkpoint"
        ) from None
    except Exception as err:  # any other unpickling failure: not a torch file at all
        raise _not_a_checkpoint(path, err) from None
    _check_zip_integrity(path)
    if not isinstance(checkpoint, dict) or "state_dict" not in checkpoint:
        raise CheckpointError(
            f"{path} is a PyTorch file but not a Lightning checkpoint (no 'state_dict'); pass "
            "a .ckpt file written by train.py"
        )
    return checkpoint


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return text[0] if text else type(err).__name__


def _not_a_checkpoint(path: Path, err: BaseException) -> CheckpointError:
    return CheckpointError(
        f"{path} is not a PyTorch checkpoint ({type(err).__name__}: {_first_line(err)[:120]}); "
        "pass a .ckpt file written by train.py"
    )


def _check_zip_integrity(path: Path) -> None:
    """Catch bit rot that ``torch.load`` does not: compare every member's CRC-32."""
    if not zipfile.is_zipfile(path):
        return  # the legacy (pre-1.6) format has no checksums
    try:
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()
    except (zipfile.BadZipFile, OSError) as err:
        bad = str(err)
    if bad is not None:
        raise CheckpointError(
            f"checkpoint {path} is corrupted (checksum error in {bad}); copy it again or use "
            "another checkpoint of the run (e.g. last.ckpt)"
        )


def model_state_dict(checkpoint: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The :class:`Transformer`'s parameters, without Lightning's ``model.`` prefix."""
    state = checkpoint["state_dict"]
    return {
        key[len(STATE_PREFIX) :]: value
        for key, value in state.items()
        if key.startswith(STATE_PREFIX)
    }


def metadata(checkpoint: dict[str, Any], path: str | os.PathLike[str] = "?") -> dict[str, Any]:
    """The ``transformer_mt`` entry (model config, tokenizer, languages, decoding)."""
    extra = checkpoint.get(CHECKPOINT_KEY)
    if not isinstance(extra, dict) or "model_config" not in extra:
        raise CheckpointError(
            f"{path} is a Lightning checkpoint but not from transformer-mt (no "
            f"'{CHECKPOINT_KEY}' entry with the model config and tokenizer); use a checkpoint "
            "written by train.py"
        )
    version = extra.get("format")
    if version != CHECKPOINT_FORMAT:
        raise CheckpointError(
            f"{path} has transformer-mt checkpoint format {version}, this code reads format "
            f"{CHECKPOINT_FORMAT}; use the transformer-mt version that wrote it"
        )
    if not extra.get("tokenizer"):
        raise CheckpointError(
            f"{path} holds no tokenizer, so its token ids cannot be turned into text; train with "
            "train.py, which stores the tokenizer in every checkpoint"
        )
    return extra


@dataclass
class LoadedModel:
    """A model ready to translate, with everything its checkpoint said about it."""

    model: Transformer
    tokenizer: Tokenizer
    config: ModelConfig
    path: Path
    src_lang: str | None = None
    tgt_lang: str | None = None
    decoding: dict[str, Any] = field(default_factory=dict)
    #: the resolved data config of training, when the checkpoint stores it (else ``None``)
    data: dict[str, Any] | None = None
    global_step: int | None = None
    epoch: int | None = None

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device


def build_model(
    checkpoint: dict[str, Any], path: str | os.PathLike[str] = "?", device: str = "cpu"
) -> LoadedModel:
    """Rebuild the :class:`Transformer` and :class:`Tokenizer` a checkpoint describes.

    Raises:
        CheckpointError: not from transformer-mt, a state dict from another model, or a
            tokenizer whose vocabulary does not match the weights.
    """
    path = Path(path)
    extra = metadata(checkpoint, path)
    try:
        config = ModelConfig.from_dict(dict(extra["model_config"]))
    except (TypeError, ValueError) as err:
        raise CheckpointError(f"{path} holds an invalid model config: {err}") from None
    try:
        tokenizer = Tokenizer.from_json(extra["tokenizer"])
    except ValueError as err:
        raise CheckpointError(f"{path} holds an unreadable tokenizer: {err}") from None
    for side, have, want in (
        ("source", tokenizer.src_vocab_size, config.src_vocab_size),
        ("target", tokenizer.tgt_vocab_size, config.tgt_vocab_size),
    ):
        if have != want:
            raise CheckpointError(
                f"{path}: the tokenizer's {side} vocabulary has {have} entries but the model "
                f"was built for {want}; the tokenizer and weights come from different runs. "
                "Use a checkpoint written by one train.py run"
            )
    if tokenizer.pad_id != config.pad_id:
        raise CheckpointError(
            f"{path}: tokenizer pad id {tokenizer.pad_id} != model pad id {config.pad_id}; "
            "use a checkpoint written by one train.py run"
        )

    model = Transformer(config)
    state = model_state_dict(checkpoint)
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    if missing or unexpected:
        raise CheckpointError(
            f"{path} does not fit the model its config describes: {len(missing)} missing "
            f"parameters (e.g. {missing[:2]}) and {len(unexpected)} unexpected ones (e.g. "
            f"{unexpected[:2]}); it is from another model or code version. Use a checkpoint "
            "written by this version of train.py"
        )
    for key, tensor in state.items():
        if tuple(tensor.shape) != tuple(expected[key].shape):
            vocab_hint = (
                " (a vocabulary size mismatch between tokenizer and weights)"
                if "embedding" in key or "generator" in key
                else ""
            )
            raise CheckpointError(
                f"{path}: parameter {key} has shape {tuple(tensor.shape)} but the model config "
                f"needs {tuple(expected[key].shape)}{vocab_hint}; the weights and the config "
                "come from different runs. Use a checkpoint written by one train.py run"
            )
    model.load_state_dict(state)
    model.eval().to(device)
    data = extra.get("data")
    return LoadedModel(
        model=model,
        tokenizer=tokenizer,
        config=config,
        path=path,
        src_lang=extra.get("src_lang") or tokenizer.src_lang,
        tgt_lang=extra.get("tgt_lang") or tokenizer.tgt_lang,
        decoding=dict(extra.get("decoding") or {}),
        data=dict(data) if isinstance(data, dict) else None,
        global_step=checkpoint.get("global_step"),
        epoch=checkpoint.get("epoch"),
    )


def load_model(path: str | os.PathLike[str], device: str = "cpu") -> LoadedModel:
    """:func:`load_checkpoint` then :func:`build_model`: a checkpoint file to a usable model."""
    return build_model(load_checkpoint(path), path, device)


def save_checkpoint(checkpoint: dict[str, Any], path: str | os.PathLike[str]) -> Path:
    """Write ``checkpoint`` atomically and durably (:func:`transformer_mt.files.atomic_write`)."""
    path = Path(path)
    with atomic_write(path) as handle:
        torch.save(checkpoint, handle)
    return path


# ----------------------------------------------------------------------------- averaging


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
    steps = [first.get("global_step")]
    for p in paths[1:]:
        ckpt = load_checkpoint(p)
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
        steps.append(ckpt.get("global_step"))
    n = len(paths)
    reference = first["state_dict"]
    averaged = {
        k: (v / n).to(reference[k].dtype) if v.is_floating_point() else v for k, v in sums.items()
    }
    meta = copy.deepcopy(first_meta)
    meta["averaged_from"] = [str(p) for p in paths]
    return {
        "state_dict": averaged,
        "global_step": max((s for s in steps if s is not None), default=0),
        "epoch": first.get("epoch"),
        "hyper_parameters": copy.deepcopy(first.get("hyper_parameters", {})),
        "pytorch-lightning_version": first.get("pytorch-lightning_version"),
        CHECKPOINT_KEY: meta,
    }


@dataclass
class CheckpointInfo:
    """A checkpoint file of a run with its step and validation score (``None`` if unknown)."""

    path: Path
    step: int | None
    score: float | None


def _score_from_callbacks(checkpoint: dict[str, Any]) -> float | None:
    """``val/bleu`` of this checkpoint as ModelCheckpoint recorded it (``current_score``)."""
    for key, state in (checkpoint.get("callbacks") or {}).items():
        if str(key).startswith("ModelCheckpoint") and isinstance(state, dict):
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
                score = _score_from_callbacks(checkpoint)
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
            "for; ask for fewer, or train with callbacks.model_checkpoint.save_top_k=N"
        )
    usable.sort(key=lambda i: (getattr(i, key_name), i.step or 0), reverse=True)
    chosen = usable[:n]
    log.info("averaging the %s %d: %s", mode, n, ", ".join(f"{i.path.name}" for i in chosen))
    return [i.path for i in chosen]
