"""The one checkpoint format: its keys, the writing side, the safe read and build-model.

Lightning's dictionary (``state_dict`` under ``model.``) plus ``checkpoint["transformer_mt"]``,
plain types that make it self-contained (:func:`write_metadata`). A checkpoint is a file from
a stranger: every load is ``torch.load(weights_only=True)`` (:func:`load_checkpoint`), so a
crafted file cannot run code, and :func:`build_model` checks that weights, config and tokenizer
fit. Errors are :class:`CheckpointError`: one line with the file, the cause and the fix.
"""

from __future__ import annotations

import os
import pickle
import re
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from transformer_mt.data.config import DataConfig
from transformer_mt.data.tokenizer import Tokenizer
from transformer_mt.errors import SettingError
from transformer_mt.files import atomic_write
from transformer_mt.model.transformer import ModelConfig, Transformer

#: Key of this project's metadata inside a Lightning checkpoint, and its format version.
CHECKPOINT_KEY = "transformer_mt"
CHECKPOINT_FORMAT = 1
#: Lightning prefixes the model's parameter names with the module attribute name.
STATE_PREFIX = "model."


class CheckpointError(ValueError):
    """A checkpoint cannot be used; the message says why and what to do."""


class CheckpointNotFoundError(CheckpointError, FileNotFoundError):
    """The checkpoint path does not exist."""


class UnsafeCheckpointError(CheckpointError):
    """The file holds pickled Python objects that ``weights_only`` loading refuses."""


def write_metadata(
    checkpoint: dict[str, Any],
    config: ModelConfig,
    tokenizer: Tokenizer | None,
    *,
    src_lang: str | None = None,
    tgt_lang: str | None = None,
    decoding: Mapping[str, Any] | None = None,
    data: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Put this project's entry into ``checkpoint``: all needed to translate with it alone, as
    plain types (``weights_only=True``). Returns the entry, where a caller may add its own."""
    entry: dict[str, Any] = {
        "format": CHECKPOINT_FORMAT,
        "model_config": config.to_dict(),
        "tokenizer": tokenizer.to_json() if tokenizer is not None else None,
        "src_lang": src_lang,
        "tgt_lang": tgt_lang,
        "decoding": dict(decoding or {}),
        "data": dict(data) if data is not None else None,
    }
    checkpoint[CHECKPOINT_KEY] = entry
    return entry


def save_checkpoint(checkpoint: dict[str, Any], path: str | os.PathLike[str]) -> Path:
    """Write ``checkpoint`` atomically and durably (:func:`transformer_mt.files.atomic_write`)."""
    path = Path(path)
    with atomic_write(path) as handle:
        torch.save(checkpoint, handle)
    return path


def load_checkpoint(path: str | os.PathLike[str], map_location: Any = "cpu") -> dict[str, Any]:
    """Read a checkpoint file safely: ``torch.load(weights_only=True)``, nothing else.

    Raises:
        CheckpointNotFoundError: no file at ``path``.
        UnsafeCheckpointError: the file contains objects that would run code when unpickled.
        CheckpointError: not a checkpoint, or truncated/corrupted.
    """
    path = Path(path)
    if path.is_dir():
        raise CheckpointNotFoundError(_directory_given(path))
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
        raise _not_a_checkpoint(path) from None
    except RuntimeError as err:
        if "zip archive" in str(err) or "central directory" in str(err):
            raise CheckpointError(
                f"checkpoint {path} is truncated or corrupted ({_first_line(err)}); it was "
                "probably not completely written or copied: copy it again or use another "
                "checkpoint of the run (e.g. last.ckpt)"
            ) from None
        raise _not_a_checkpoint(path) from None
    except EOFError:
        raise CheckpointError(f"checkpoint {path} is empty or truncated; copy it again") from None
    except Exception:  # any other unpickling failure: not a torch file at all
        raise _not_a_checkpoint(path) from None
    _check_zip_integrity(path)
    if not isinstance(checkpoint, dict) or "state_dict" not in checkpoint:
        raise CheckpointError(
            f"{path} is a PyTorch file but not a Lightning checkpoint (no 'state_dict'); pass "
            "a .ckpt file written by train.py"
        )
    return checkpoint


def _directory_given(path: Path) -> str:
    """The message for a directory passed as a checkpoint: name a file that is there."""
    found = sorted(path.glob("**/*.ckpt"), key=lambda p: (p.name != "last.ckpt", len(p.parts)))
    if found:
        names = ", ".join(sorted(p.name for p in found)[:5])
        return (
            f"checkpoint path {path} is a directory (it holds {names}); pass a file such as "
            f"{found[0]}"
        )
    return (
        f"checkpoint path {path} is a directory without .ckpt files; pass the path of a .ckpt "
        "file written by train.py, e.g. outputs/<task>/runs/<time>/checkpoints/last.ckpt"
    )


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return text[0] if text else type(err).__name__


def _not_a_checkpoint(path: Path) -> CheckpointError:
    # The unpickler's own words (an IndexError, a note about torch versions) describe its
    # internals, not the file.
    return CheckpointError(
        f"{path} is not a PyTorch checkpoint (torch.load cannot read it as one); pass a .ckpt "
        "file written by train.py"
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
    n = len(STATE_PREFIX)
    return {k[n:]: v for k, v in checkpoint["state_dict"].items() if k.startswith(STATE_PREFIX)}


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

    def data_config(self) -> DataConfig | None:
        """The data config this checkpoint trained on (``None`` if it stores none)."""
        if not self.data:
            return None
        try:
            return DataConfig.from_dict(self.data)
        except (TypeError, ValueError) as err:
            raise CheckpointError(f"{self.path} holds an invalid data config: {err}") from None


def _config_and_tokenizer(extra: dict[str, Any], path: Path) -> tuple[ModelConfig, Tokenizer]:
    """The model config and tokenizer a checkpoint stores, checked against each other."""
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
    return config, tokenizer


def _check_state_fits(
    state: dict[str, torch.Tensor], expected: dict[str, torch.Tensor], path: Path
) -> None:
    """The stored weights have exactly the model's parameter names and shapes."""
    missing, unexpected = sorted(set(expected) - set(state)), sorted(set(state) - set(expected))
    if missing or unexpected:
        raise CheckpointError(
            f"{path} does not fit the model its config describes: {len(missing)} missing "
            f"parameters (e.g. {missing[:2]}) and {len(unexpected)} unexpected ones (e.g. "
            f"{unexpected[:2]}); it is from another model or code version. Use a checkpoint "
            "written by this version of train.py"
        )
    for key, tensor in state.items():
        if tuple(tensor.shape) != tuple(expected[key].shape):
            vocab = "embedding" in key or "generator" in key
            vocab_hint = " (tokenizer and weights disagree on the vocabulary)" if vocab else ""
            raise CheckpointError(
                f"{path}: parameter {key} has shape {tuple(tensor.shape)} but the model config "
                f"needs {tuple(expected[key].shape)}{vocab_hint}; the weights and the config "
                "come from different runs. Use a checkpoint written by one train.py run"
            )


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
    config, tokenizer = _config_and_tokenizer(extra, path)
    model = Transformer(config)
    state = model_state_dict(checkpoint)
    _check_state_fits(state, model.state_dict(), path)
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


def resolve_device(device: str | None) -> str:
    """``"auto"``/``None`` -> ``"cuda"`` if available, else ``"mps"`` if available, else CPU."""
    if device in (None, "", "auto"):
        if torch.cuda.is_available():
            return "cuda"
        if torch.backends.mps.is_available():
            return "mps"
        return "cpu"
    if str(device).startswith("cuda") and not torch.cuda.is_available():
        raise SettingError(
            f"device {device} needs CUDA, which is not available", [("device", "cpu")], lead="use"
        )
    try:  # a device type torch does not know, or has no backend for here
        torch.empty(0, device=device)
    except (RuntimeError, AssertionError):
        raise SettingError(
            f"device {device} is not a device this torch can use", [("device", "cpu")], lead="use"
        ) from None
    return str(device)
