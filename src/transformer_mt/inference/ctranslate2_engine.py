"""The CTranslate2 engine: decode with a model that ``transformer-mt-export --format ctranslate2``
wrote, through the one decode loop (:mod:`transformer_mt.inference.decode`).

:class:`CTranslate2Engine` implements :class:`~transformer_mt.inference.decode.Engine` on the
collated batches every engine gets: the same source rows (``ids + <eos>``), the same
per-sentence length cap ``max_len_a * source length + max_len_b`` (``<eos>`` included), and the
same ``<pad>``/``<bos>`` never generated. Greedy output is token-for-token ours. CTranslate2's
beam search divides scores by ``length ** alpha``: ours with ``length_norm=power``; with our
default ``gnmt`` the two rank hypotheses alike only at alpha 0.

``compute_type="int8"`` quantizes a float32 model when it is loaded, so one converted directory
serves both precisions.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from transformer_mt.checkpoint import LoadedModel
from transformer_mt.data.tokenizer import BOS, PAD, Tokenizer
from transformer_mt.errors import ExportError, SettingError, require_export_extra
from transformer_mt.inference.search import Hypothesis, SearchConfig, Steering, output_caps

log = logging.getLogger(__name__)

#: Writes the CTranslate2 model of a loaded checkpoint into a new directory. The export wing
#: has it (:func:`transformer_mt.export.convert.convert_for_engine`); a command passes it in,
#: since decoding sits below export.
Converter = Callable[[LoadedModel, Path], object]

#: Where the exporter keeps our tokenizer and metadata inside an exported directory.
META_DIR = "transformer_mt"


class CTranslate2Engine:
    """Decode and score with a converted CTranslate2 model directory.

    Args:
        model_dir: written by ``transformer-mt-export --format ctranslate2``.
        compute_type: ``"default"`` (the stored weights), ``"int8"``, ``"float32"``, ...
        threads: intra-op threads (0 = CTranslate2's default).
        device: ``"cpu"`` or ``"cuda"``.
    """

    def __init__(
        self,
        model_dir: str | os.PathLike[str],
        *,
        compute_type: str = "default",
        threads: int = 0,
        device: str = "cpu",
        tokenizer: Tokenizer | None = None,
    ) -> None:
        self.model_dir = Path(model_dir)
        self.tokenizer = read_model_tokenizer(self.model_dir, tokenizer)
        #: the model's positional limit, as the export recorded it
        generation = _read_json(self.model_dir / "generation_config.json")
        self.max_len = int(generation.get("max_length") or 1024)
        self.compute_type = check_compute_type(compute_type, device)
        self.translator = _load_translator(self.model_dir, compute_type, threads, device)
        self._tmp: Any = None

    @classmethod
    def converted(cls, loaded: LoadedModel, convert: Converter, **kw: Any) -> CTranslate2Engine:
        """Convert ``loaded`` with ``convert`` into a temporary directory and load it there.

        The directory is removed with the engine.
        """
        tmp = tempfile.TemporaryDirectory(prefix="transformer-mt-ct2-")
        target = Path(tmp.name) / "ct2"
        log.info("converting %s to CTranslate2 in %s", loaded.path, target)
        convert(loaded, target)
        engine = cls(target, **kw)
        engine._tmp = tmp
        return engine

    def _source_tokens(self, batch: dict[str, Any]) -> tuple[list[int], list[list[str]]]:
        """Rows with a non-empty source and their tokens (``ids + <eos>``, no padding)."""
        pad, eos, vocab = self.tokenizer.pad_id, self.tokenizer.eos_id, self.tokenizer.src
        rows, tokens = [], []
        for i, row in enumerate(batch["src"].tolist()):
            if row and row[0] != eos:
                rows.append(i)
                tokens.append([vocab.id_to_token(t) for t in row if t != pad])
        return rows, tokens

    def decode_batch(self, batch: dict[str, Any], search: SearchConfig) -> list[list[Hypothesis]]:
        """:meth:`~transformer_mt.inference.decode.Engine.decode_batch` with CTranslate2.

        One ``translate_batch`` call (``num_hypotheses`` = ``search.nbest``); the scores are
        CTranslate2's (normalised by ``length ** alpha``). A forced prefix is CTranslate2's
        ``target_prefix`` (its scores, like ours, leave the prefix out). Sampling is
        CTranslate2's own; a seed and constraints are refused: CTranslate2 seeds its generator
        when a worker thread starts, not per call, so seeded samples could not repeat, and it
        has no constrained beam search.
        """
        check_ct2_search(search, bool(batch.get("constraint_ids") and any(batch["constraint_ids"])))
        out = [[Hypothesis([], 0.0)] for _ in range(batch["src"].size(0))]
        rows, tokens = self._source_tokens(batch)
        if not rows:
            return out
        prefixes = self._prefix_tokens(batch, rows)
        steer = Steering(None if prefixes is None else [batch["prefix_ids"][r] for r in rows])
        caps = output_caps(torch.tensor([len(t) for t in tokens]), search, steer, self.max_len)
        # Output tokens before <eos>: one fewer than our cap, which counts the <eos>.
        caps = [c - 1 for c in caps.tolist()]
        results = self.translator.translate_batch(tokens, prefixes, **self._options(search, caps))
        vocab = self.tokenizer.tgt
        for row, cap, result in zip(rows, caps, results):
            out[row] = [
                Hypothesis([vocab.token_to_id(t) for t in hyp][:cap], float(score))
                for hyp, score in zip(result.hypotheses, result.scores)
            ]
        return out

    def _options(self, search: SearchConfig, caps: list[int]) -> dict[str, Any]:
        options: dict[str, Any] = dict(
            beam_size=search.beam_size,
            length_penalty=search.length_penalty,
            num_hypotheses=search.nbest,
            return_scores=True,
            max_decoding_length=max(max(caps), 1),
            max_input_length=0,
            suppress_sequences=[[PAD], [BOS]],
        )
        if search.sampling:
            options.update(
                sampling_topk=search.sampling_topk or 0,
                sampling_topp=1.0 if search.sampling_topp is None else search.sampling_topp,
                sampling_temperature=search.temperature,
            )
        return options

    def _prefix_tokens(self, batch: dict[str, Any], rows: list[int]) -> list[list[str]] | None:
        prefixes = batch.get("prefix_ids")
        if prefixes is None or not any(prefixes[r] for r in rows):
            return None
        vocab = self.tokenizer.tgt
        return [[vocab.id_to_token(t) for t in prefixes[r]] for r in rows]

    def score_batch(self, batch: dict[str, Any]) -> list[list[float]]:
        """:meth:`~transformer_mt.inference.decode.Engine.score_batch` with CTranslate2's
        ``score_batch``: per-token log-probabilities, ``<eos>`` included."""
        pad, bos, eos = self.tokenizer.pad_id, self.tokenizer.bos_id, self.tokenizer.eos_id
        src_vocab, tgt_vocab = self.tokenizer.src, self.tokenizer.tgt
        sources = [
            [src_vocab.id_to_token(t) for t in row if t != pad] for row in batch["src"].tolist()
        ]
        targets = [
            [tgt_vocab.id_to_token(t) for t in row if t not in (pad, bos, eos)]
            for row in batch["tgt"].tolist()
        ]
        results = self.translator.score_batch(sources, targets, max_input_length=0)
        return [list(r.log_probs) for r in results]


def check_ct2_search(search: SearchConfig, constrained: bool = False) -> None:
    """Refuse what CTranslate2 cannot do: seeded sampling and constraints (one line each)."""
    if search.sampling and search.seed is not None:
        raise SettingError(
            "the ctranslate2 engine cannot repeat seeded samples (it seeds its generator when "
            "a worker thread starts, not per call)", [("engine", "torch")],
            lead="use", tail="for seeded sampling, or leave out the seed",
        )  # fmt: skip
    if constrained:
        raise SettingError(
            "the ctranslate2 engine cannot decode with constraints (it has no constrained beam "
            "search)", [("engine", "torch")], lead="use",
        )  # fmt: skip


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


def _load_translator(model_dir: Path, compute_type: str, threads: int, device: str) -> Any:
    """The ``ctranslate2.Translator``; one line naming the cause when it cannot load."""
    ctranslate2 = require_export_extra("ctranslate2")
    try:
        return ctranslate2.Translator(
            str(model_dir),
            device=device,
            compute_type=compute_type,
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
