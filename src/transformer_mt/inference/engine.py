"""The torch engine (one model or an ensemble) and the choice of engine for the commands.

:class:`TorchEngine` implements :class:`~transformer_mt.inference.decode.Engine` with our
search (:mod:`transformer_mt.inference.search`) and teacher-forced scoring. Several
checkpoints form an ensemble: the models' log-probabilities are averaged at each step, each
model with its own key/value cache; :func:`check_ensemble` refuses checkpoints that do not share
the tokenizer, since their ids would mean different words.
"""

from __future__ import annotations

import copy
import logging
import os
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from transformer_mt.checkpoint import CheckpointError, LoadedModel
from transformer_mt.errors import SettingError
from transformer_mt.inference.ctranslate2_engine import Converter, CTranslate2Engine
from transformer_mt.inference.decode import Engine
from transformer_mt.inference.search import (
    Hypothesis,
    SearchConfig,
    Steering,
    as_models,
    search_batch,
)
from transformer_mt.model.transformer import Transformer

log = logging.getLogger(__name__)

#: Decoding engines of evaluate.py (``engine=``) and the commands' ``--engine``.
ENGINES = ("torch", "ctranslate2")


class TorchEngine:
    """Decode and score with one :class:`Transformer` or an ensemble of them.

    Args:
        models: A model, or several sharing one tokenizer (see :func:`check_ensemble`).
        bos_id, eos_id: The tokenizer's special ids.
        compute_type: See :data:`TORCH_COMPUTE_TYPES`.
    """

    def __init__(
        self,
        models: Transformer | Sequence[Transformer],
        *,
        bos_id: int,
        eos_id: int,
        compute_type: str = "default",
    ) -> None:
        self.compute_type = check_torch_compute_type(compute_type)
        self.models = as_models(models)
        if compute_type == "int8":
            self.models = [quantize_int8(m) for m in self.models]
        self.bos_id, self.eos_id = bos_id, eos_id

    @classmethod
    def from_loaded(
        cls,
        loaded: LoadedModel | Sequence[LoadedModel],
        compute_type: str = "default",
    ) -> TorchEngine:
        """The engine of one loaded checkpoint or an ensemble of them (checked)."""
        loaded = [loaded] if isinstance(loaded, LoadedModel) else list(loaded)
        check_ensemble(loaded)
        tok = loaded[0].tokenizer
        return cls(
            [m.model for m in loaded],
            bos_id=tok.bos_id,
            eos_id=tok.eos_id,
            compute_type=compute_type,
        )

    @property
    def device(self) -> torch.device:
        return next(self.models[0].parameters()).device

    @torch.no_grad()
    def decode_batch(self, batch: dict[str, Any], search: SearchConfig) -> list[list[Hypothesis]]:
        """:meth:`~transformer_mt.inference.decode.Engine.decode_batch` with our search.

        A row with an empty source (``<eos>`` alone) gives an empty hypothesis without running
        the models: there is nothing to translate. ``batch["prefix_ids"]`` and
        ``batch["constraint_ids"]``, when present, steer each row (:class:`Steering`).
        """
        src = batch["src"].to(self.device)  # (B, S)
        out = [[Hypothesis([], 0.0)] for _ in range(src.size(0))]
        rows = (src[:, 0] != self.eos_id).nonzero().squeeze(1).tolist()
        if not rows:
            return out
        if len(rows) < src.size(0):
            src = src[rows]
        steer = steering(batch).rows(rows)
        found = search_batch(
            self.models, src, bos_id=self.bos_id, eos_id=self.eos_id, search=search, steer=steer
        )
        for row, hyps in zip(rows, found):
            out[row] = hyps
        return out

    @torch.no_grad()
    def score_batch(self, batch: dict[str, Any]) -> list[list[float]]:
        """Teacher-forced log-probability of each target token (``<eos>`` included).

        For an ensemble, the mean of the models' log-probabilities, as in the search.
        """
        src = batch["src"].to(self.device)  # (B, S)
        tgt = batch["tgt"].to(self.device)  # (B, T + 1): <bos> + ids + <eos>, padded
        tgt_in, tgt_out = tgt[:, :-1], tgt[:, 1:]  # (B, T)
        lprobs = torch.stack(
            [
                model(src, tgt_in).float().log_softmax(-1).gather(-1, tgt_out[..., None])
                for model in self.models
            ]
        ).mean(dim=0)[..., 0]  # (B, T)
        lengths = (tgt_out != self.models[0].pad_id).sum(dim=1).tolist()  # (B,)
        return [row[:n] for row, n in zip(lprobs.tolist(), lengths)]


def steering(batch: dict[str, Any]) -> Steering:
    """The per-row prefixes and constraints a collated batch carries (none if absent)."""
    return Steering(batch.get("prefix_ids"), batch.get("constraint_ids"))


def check_ensemble(loaded: Sequence[LoadedModel]) -> None:
    """Checkpoints decoded together must share the tokenizer (ids mean the same words).

    Raises:
        CheckpointError: one line naming the two checkpoints and what differs.
    """
    first = loaded[0]
    for other in loaded[1:]:
        difference = _tokenizer_difference(first, other)
        if difference:
            raise CheckpointError(
                f"{first.path} and {other.path} cannot decode together: {difference}; an "
                "ensemble needs checkpoints trained with one tokenizer (e.g. of one run)"
            )


def _tokenizer_difference(a: LoadedModel, b: LoadedModel) -> str | None:
    ta, tb = a.tokenizer, b.tokenizer
    if bool(ta.target_languages) != bool(tb.target_languages):
        multi, single = (a, b) if ta.target_languages else (b, a)
        return (
            f"{Path(multi.path).name} is multilingual (into "
            f"{', '.join(multi.tokenizer.target_languages)}) and {Path(single.path).name} "
            f"translates one direction"
        )
    for what, x, y in (
        ("source vocabulary size", ta.src_vocab_size, tb.src_vocab_size),
        ("target vocabulary size", ta.tgt_vocab_size, tb.tgt_vocab_size),
        ("pad id", a.config.pad_id, b.config.pad_id),
        ("source language", a.src_lang, b.src_lang),
        ("target language", a.tgt_lang, b.tgt_lang),
    ):
        if x != y:
            return f"their {what} differs ({x} vs {y})"
    if ta.src.to_str() != tb.src.to_str() or ta.tgt.to_str() != tb.tgt.to_str():
        return "their tokenizers have the same sizes but different vocabularies or merges"
    return None


#: What ``compute_type`` the torch engine runs: the checkpoint's weights as they are
#: (``default``, ``float32``), or ``int8``: dynamic quantization of every linear layer.
TORCH_COMPUTE_TYPES = ("default", "float32", "int8")


def check_torch_compute_type(compute_type: str) -> str:
    """``compute_type`` if the torch engine runs it; else one line naming those it does."""
    if compute_type not in TORCH_COMPUTE_TYPES:
        raise SettingError(
            f"the torch engine has no compute type {compute_type!r}",
            [("compute_type", "int8")],
            lead="use",
            tail="(or default, float32)",
        )
    return compute_type


def quantize_int8(model: Transformer) -> Transformer:
    """A copy of ``model`` whose linear layers compute in int8 (CPU decoding).

    Dynamic quantization (``torch.ao.quantization.quantize_dynamic``): weights are stored as
    int8 with one scale per layer, activations are quantized per batch as they arrive, and the
    products accumulate in int32; embeddings, LayerNorm and softmax stay float32. The output
    projection is quantized too (it is the largest matmul of a decoding step), which unties it
    from the target embedding in the copy; the model passed in is left as it was.

    Raises:
        SettingError: the model is not on the CPU (PyTorch quantizes linear layers for CPUs).
    """
    device = next(model.parameters()).device
    if device.type != "cpu":
        raise SettingError(
            f"compute type int8 runs on the CPU only, and the model is on {device}",
            [("device", "cpu"), ("compute_type", "default")],
            lead="use",
        )
    with warnings.catch_warnings():
        # PyTorch announces that its quantized tensor types will move out of torch itself;
        # the pinned version runs them, and the message would reach every user.
        warnings.filterwarnings("ignore", message=".*quantize_per_tensor.*", category=UserWarning)
        quantized = torch.ao.quantization.quantize_dynamic(
            copy.deepcopy(model), {nn.Linear}, dtype=torch.qint8
        )
    return quantized.eval()


def open_engine(
    kind: str | None,
    loaded: Sequence[LoadedModel],
    *,
    ct2_model: str | os.PathLike[str] | None = None,
    compute_type: str | None = None,
    threads: int | None = None,
    convert: Converter | None = None,
) -> Engine:
    """The engine ``kind`` (``"torch"``, default, or ``"ctranslate2"``) for ``loaded``.

    ``ct2_model``: a directory written by ``transformer-mt-export --format ctranslate2``; else
    ``convert`` writes one from the loaded checkpoint into a temporary directory that lives as
    long as the engine.

    Raises:
        ValueError: an unknown engine, CTranslate2 asked for an ensemble, or neither a model
            directory nor a converter.
    """
    if kind in (None, "", "torch"):
        return TorchEngine.from_loaded(loaded, compute_type=compute_type or "default")
    if kind != "ctranslate2":
        raise ValueError(f"unknown engine {kind!r}; use one of {', '.join(ENGINES)}")
    if len(loaded) != 1:
        raise SettingError(
            f"the ctranslate2 engine decodes one checkpoint, got {len(loaded)}",
            [("engine", "torch")],
            lead="decode an ensemble with",
        )
    options: dict[str, Any] = {"compute_type": compute_type, "threads": threads}
    options = {k: v for k, v in options.items() if v is not None}
    options["tokenizer"] = loaded[0].tokenizer  # the model directory's must be the checkpoint's
    if ct2_model:
        return CTranslate2Engine(ct2_model, **options)
    if convert is None:
        raise ValueError(
            "the ctranslate2 engine needs a CTranslate2 model directory here; write one with "
            "transformer-mt-export --ckpt CKPT --out DIR --format ctranslate2"
        )
    return CTranslate2Engine.converted(loaded[0], convert, **options)
