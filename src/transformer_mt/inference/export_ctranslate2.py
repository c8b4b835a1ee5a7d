"""Decode with a CTranslate2 model that ``transformer-mt-export --format ctranslate2`` wrote.

:class:`CTranslate2Translator` has the contract of
:class:`transformer_mt.inference.translate.Translator` (``translate_ids``, ``translate``): the
same tokenizer (read from the model directory), the same source rows (``ids + <eos>``), the same
per-sentence length cap ``max_len_a * source length + max_len_b`` (``<eos>`` included), and the
same ``<pad>``/``<bos>`` never generated. Greedy output is token-for-token ours; beam search
differs only in the length penalty convention (CTranslate2 divides by ``length ** alpha``, ours
by GNMT's ``((5 + length) / 6) ** alpha``).

``compute_type="int8"`` quantizes a float32 model when it is loaded, so one converted directory
serves both precisions.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import torch

from transformer_mt.data.tokenizer import BOS, PAD, Tokenizer
from transformer_mt.inference.export_hf import ExportError, _require
from transformer_mt.inference.search import SearchConfig

log = logging.getLogger(__name__)

#: Where the exporter keeps our tokenizer and metadata inside an exported directory.
META_DIR = "transformer_mt"


def _length_batches(lengths: Sequence[int], max_tokens: int) -> list[list[int]]:
    """Indices sorted by length (longest first), cut so that ``B * max(len) <= max_tokens``."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    batches: list[list[int]] = []
    current: list[int] = []
    for i in order:
        width = lengths[current[0]] if current else lengths[i]
        if current and (len(current) + 1) * width > max_tokens:
            batches.append(current)
            current = []
        current.append(i)
    if current:
        batches.append(current)
    return batches


class CTranslate2Translator:
    """Batched translation with a converted CTranslate2 model directory.

    Args:
        model_dir: written by ``transformer-mt-export --format ctranslate2``.
        search: decoding options (defaults: the ``generation_config.json`` beam size and
            length penalty written at export).
        compute_type: ``"default"`` (the stored weights), ``"int8"``, ``"float32"``, ...
        threads: intra-op threads (0 = CTranslate2's default).
        max_tokens: padded source tokens per batch.
        device: ``"cpu"`` or ``"cuda"``.
        tokenizer: the checkpoint's tokenizer; the model directory's must equal it.
    """

    def __init__(
        self,
        model_dir: str | os.PathLike[str],
        search: SearchConfig | None = None,
        *,
        compute_type: str = "default",
        threads: int = 0,
        max_tokens: int = 4096,
        device: str = "cpu",
        tokenizer: Tokenizer | None = None,
    ) -> None:
        ctranslate2 = _require("ctranslate2")
        model_dir = Path(model_dir)
        self.model_dir = model_dir
        self.tokenizer = read_model_tokenizer(model_dir, tokenizer)
        generation = _read_json(model_dir / "generation_config.json")
        self.max_len = int(generation.get("max_length") or 1024)
        if search is None:
            search = SearchConfig(
                beam_size=int(generation.get("num_beams") or 1),
                length_penalty=float(generation.get("length_penalty") or 0.0),
            )
        self.search = search
        self.max_tokens = max_tokens
        self.compute_type = check_compute_type(compute_type, device)
        try:
            self.translator = ctranslate2.Translator(
                str(model_dir),
                device=device,
                compute_type=compute_type,
                inter_threads=1,
                intra_threads=threads,
            )
        except ValueError as err:  # a compute type or device this machine cannot run
            raise ExportError(
                f"cannot load the CTranslate2 model {model_dir} with compute type "
                f"{compute_type!r} on {device}: {' '.join(str(err).split())}; on {device} it runs "
                f"{supported_compute_types(device)} (or default, auto)"
            ) from None
        except RuntimeError as err:  # a damaged model.bin
            raise ExportError(
                f"cannot load the CTranslate2 model {model_dir}: {' '.join(str(err).split())}; "
                "export the checkpoint again with transformer-mt-export --format ctranslate2"
            ) from None
        self._suppress = [[PAD], [BOS]]
        self._tmp: Any = None

    @classmethod
    def from_checkpoint(
        cls,
        ckpt: str | os.PathLike[str],
        cache_dir: str | os.PathLike[str] | None = None,
        **kw: Any,
    ) -> CTranslate2Translator:
        """Convert ``ckpt`` (into ``cache_dir``, else a temporary directory) and load it.

        An existing conversion in ``cache_dir`` is reused.
        """
        from transformer_mt.inference.export import export_ctranslate2, export_huggingface

        tmp = None
        if cache_dir is None:
            tmp = tempfile.TemporaryDirectory(prefix="transformer-mt-ct2-")
            cache_dir = Path(tmp.name) / "ct2"
        target = Path(cache_dir)
        if not (target / "model.bin").is_file():
            log.info("converting %s to CTranslate2 in %s", ckpt, target)
            with tempfile.TemporaryDirectory() as hf_tmp:
                hf_dir = export_huggingface(ckpt, Path(hf_tmp) / "hf")
                export_ctranslate2(hf_dir, target, force=True)
        engine = cls(target, **kw)
        engine._tmp = tmp  # removed with the engine
        return engine

    def encode(self, lines: Sequence[str]) -> list[list[int]]:
        """Source ids per line (no ``<eos>``), cut to the model's positional limit."""
        ids = self.tokenizer.encode_src_batch([line.strip() for line in lines])
        limit = self.max_len - 1
        if any(len(seq) > limit for seq in ids):
            log.warning("lines longer than the model's max_len %d were truncated", limit)
        return [seq[:limit] for seq in ids]

    def _caps(self, lengths: Sequence[int]) -> list[int]:
        """Our per-sentence cap on generated tokens, ``<eos>`` included (search.py's rule)."""
        s = self.search  # float32 arithmetic as in search.py, so the floor agrees at the edges
        caps = (s.max_len_a * torch.tensor(lengths).float() + s.max_len_b).floor().long()
        return caps.clamp(min=1, max=self.max_len).tolist()

    def decode_rows(self, rows: Sequence[Sequence[int]]) -> list[list[int]]:
        """Output ids (no ``<bos>``/``<eos>``) for source rows ``ids + <eos>`` (no padding).

        One CTranslate2 call; the caller batches (sources of similar length together).
        """
        src, tgt = self.tokenizer.src, self.tokenizer.tgt
        tokens = [[src.id_to_token(t) for t in row] for row in rows]
        # Output tokens before <eos>: one fewer than the cap (our cap counts the <eos>).
        caps = [c - 1 for c in self._caps([len(r) for r in rows])]
        results = self.translator.translate_batch(
            tokens,
            beam_size=self.search.beam_size,
            length_penalty=self.search.length_penalty,
            max_decoding_length=max(max(caps), 1),
            max_input_length=0,
            suppress_sequences=self._suppress,
            return_scores=False,
        )
        return [
            [tgt.token_to_id(t) for t in result.hypotheses[0]][:cap]
            for cap, result in zip(caps, results)
        ]

    def decode_batch(self, batch: dict[str, Any]) -> list[list[int]]:
        """:func:`transformer_mt.inference.decode.decode_batch` for this engine: a collated
        ``batch["src"]`` (``ids + <eos>``, padded) -> output ids per row; empty sources give
        empty outputs."""
        pad, eos = self.tokenizer.pad_id, self.tokenizer.eos_id
        src = batch["src"].tolist()
        out: list[list[int]] = [[] for _ in src]
        todo = [i for i, row in enumerate(src) if row and row[0] != eos]
        if todo:
            hyps = self.decode_rows([[t for t in src[i] if t != pad] for i in todo])
            for i, hyp in zip(todo, hyps):
                out[i] = hyp
        return out

    def decode(
        self, batches: Iterable[dict[str, Any]], progress: Callable[[int], None] | None = None
    ) -> list[list[int]]:
        """:func:`transformer_mt.inference.decode.decode` for this engine: output ids of every
        collated batch, in input order (by ``batch["index"]``)."""
        by_index: dict[int, list[int]] = {}
        for batch in batches:
            hyps = self.decode_batch(batch)
            by_index.update(zip(batch["index"].tolist(), hyps))
            if progress is not None:
                progress(len(hyps))
        return [by_index[i] for i in sorted(by_index)]

    def translate_ids(self, ids: Sequence[Sequence[int]]) -> list[list[int]]:
        """Output ids (no ``<bos>``/``<eos>``) for each source id list, in order."""
        out: list[list[int]] = [[] for _ in ids]
        todo = [i for i, seq in enumerate(ids) if len(seq) > 0]
        if not todo:
            return out
        eos = self.tokenizer.eos_id
        lengths = [len(ids[i]) + 1 for i in todo]  # + <eos>
        for batch in _length_batches(lengths, self.max_tokens):
            hyps = self.decode_rows([[*ids[todo[j]], eos] for j in batch])
            for j, hyp in zip(batch, hyps):
                out[todo[j]] = hyp
        return out

    def translate(self, lines: Sequence[str], progress: bool = False) -> list[str]:
        """One translation per line, in order; never a line break inside a translation.

        ``progress`` is accepted for the torch Translator's signature and ignored.
        """
        return self.tokenizer.decode_hypotheses(self.translate_ids(self.encode(lines)))


def read_model_tokenizer(model_dir: Path, expected: Tokenizer | None = None) -> Tokenizer:
    """The tokenizer inside an exported model directory, checked before the first batch.

    Raises:
        ExportError: not a CTranslate2 export of ours, or (with ``expected``, the checkpoint's
            tokenizer) a model exported from a checkpoint with another tokenizer: its ids
            would mean other subwords and every line would decode to garbage.
    """
    if not model_dir.is_dir() or not (model_dir / "model.bin").is_file():
        raise ExportError(
            f"{model_dir} is not a CTranslate2 model directory (no model.bin); write one "
            "with transformer-mt-export --ckpt CKPT --out DIR --format ctranslate2"
        )
    if not (model_dir / META_DIR).is_dir():
        raise ExportError(
            f"{model_dir} has no {META_DIR}/ tokenizer: it was not written by "
            "transformer-mt-export; export the checkpoint again"
        )
    try:
        tokenizer = Tokenizer.load(model_dir / META_DIR)
    except (OSError, ValueError) as err:
        raise ExportError(
            f"cannot read the tokenizer of {model_dir} ({' '.join(str(err).split())}); "
            "export the checkpoint again"
        ) from None
    how = None if expected is None else expected.difference(tokenizer)
    if how is not None:
        raise ExportError(
            f"the CTranslate2 model {model_dir} was exported from a checkpoint with another "
            f"tokenizer than the checkpoint's (checkpoint vs model: {how}); pass the "
            "CTranslate2 export of this checkpoint (transformer-mt-export --ckpt CKPT --out DIR "
            "--format ctranslate2), or leave out the model directory to convert it on the fly"
        )
    return tokenizer


#: Every compute type CTranslate2 knows; which of them run on a device it says itself.
COMPUTE_TYPES = (
    "default", "auto", "int8", "int8_float32", "int8_float16", "int8_bfloat16", "int16",
    "float16", "bfloat16", "float32",
)  # fmt: skip


def supported_compute_types(device: str) -> str:
    """The compute types CTranslate2 runs on ``device``, for messages."""
    import ctranslate2

    try:
        return ", ".join(sorted(ctranslate2.get_supported_compute_types(device)))
    except (RuntimeError, ValueError):
        return "none (CTranslate2 cannot use this device)"


def check_compute_type(compute_type: str, device: str) -> str:
    """``compute_type`` if CTranslate2 knows it; else one line listing those ``device`` runs."""
    if compute_type not in COMPUTE_TYPES:
        raise ExportError(
            f"unknown compute type {compute_type!r}; on {device} CTranslate2 runs "
            f"{supported_compute_types(device)} (or default, auto)"
        )
    return compute_type


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise ExportError(f"cannot read {path} ({err}); export the checkpoint again") from None
    return data if isinstance(data, dict) else {}


#: Decoding engines of evaluate.py (``engine=``) and transformer-mt-translate (``--engine``).
ENGINES = ("torch", "ctranslate2")


def open_engine(
    engine: str | None,
    ckpt: str | os.PathLike[str],
    search: SearchConfig,
    model_dir: str | os.PathLike[str] | None = None,
    **kw: Any,
) -> CTranslate2Translator | None:
    """``None`` for our torch decoding, else the CTranslate2 engine of ``ckpt``.

    ``model_dir``: a directory written by ``transformer-mt-export --format ctranslate2`` (else
    the checkpoint is converted into a temporary directory first, which takes seconds).
    ``kw``: :class:`CTranslate2Translator` options (``compute_type``, ``threads``, ...).
    """
    if engine in (None, "", "torch"):
        return None
    if engine != "ctranslate2":
        raise ExportError(f"unknown engine {engine!r}; use one of {', '.join(ENGINES)}")
    kw = {k: v for k, v in kw.items() if v is not None}
    if model_dir:
        return CTranslate2Translator(model_dir, search, **kw)
    return CTranslate2Translator.from_checkpoint(ckpt, None, search=search, **kw)
