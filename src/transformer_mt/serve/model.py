"""The model behind the service: one checkpoint (or an ensemble) and one decoding engine,
called from the batcher's worker thread through the translator ``transformer-mt-translate``
uses."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from transformer_mt.checkpoint import LoadedModel, build_model, load_checkpoint, load_model
from transformer_mt.inference.attention_maps import KINDS, record_maps
from transformer_mt.inference.averaging import stored_val_bleu
from transformer_mt.inference.decode import Engine
from transformer_mt.inference.engine import Converter, open_engine
from transformer_mt.inference.search import SearchConfig, stop_when
from transformer_mt.inference.translator import Translation, Translator

#: Engine calls with fewer rows (sentences x beams) run on one intra-op thread: waking a second
#: costs a small call more than it gains (docs/serve.md).
ONE_THREAD_ROWS = 32

#: The stored decoding defaults ``GET /model`` shows.
DECODING_INFO = ("beam_size", "length_penalty", "length_norm", "max_len_a", "max_len_b")


class ServedModel:
    """A checkpoint ready to serve: translation through ``engine`` (default: torch over
    ``ensemble``, whose first model's decoding defaults and attention serve), attention through
    torch. ``threads``: intra-op threads of calls of :data:`ONE_THREAD_ROWS` rows or more (0 =
    torch's default); ``engine_kind``, ``compute_type`` and ``val_bleu`` are for ``GET /model``.
    """

    def __init__(
        self,
        ensemble: Sequence[LoadedModel],
        *,
        engine: Engine | None = None,
        engine_kind: str = "torch",
        compute_type: str | None = None,
        threads: int = 0,
        max_tokens: int | None = None,
        val_bleu: float | None = None,
        tgt_lang: str | None = None,
    ) -> None:
        self.ensemble = list(ensemble)
        self.loaded = self.ensemble[0]
        self.defaults = SearchConfig.from_stored(self.loaded.decoding)
        known = self.loaded.tokenizer.target_languages
        #: a multilingual model started without --tgt-lang: each request names its language
        self.needs_tgt_lang = tgt_lang is None and len(known) > 1
        self.translator = Translator(
            self.ensemble,
            self.defaults,
            max_tokens=max_tokens,
            engine=engine,
            tgt_lang=known[0] if self.needs_tgt_lang else tgt_lang,
        )
        self.engine = self.translator.engine
        self.engine_kind = engine_kind
        self.compute_type = compute_type or "default"
        self.threads = threads or torch.get_num_threads()
        self.val_bleu = val_bleu

    @classmethod
    def open(
        cls,
        ckpt: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
        *,
        engine: str = "torch",
        ct2_model: str | os.PathLike[str] | None = None,
        compute_type: str | None = None,
        threads: int = 0,
        convert: Converter | None = None,
        tgt_lang: str | None = None,
    ) -> ServedModel:
        """Load ``ckpt`` (each file read once, on the CPU) and open the engine ``engine``.

        ``ct2_model``: a directory of ``transformer-mt-export --format ctranslate2``; else
        ``convert`` writes one at start-up (:func:`~transformer_mt.inference.engine.open_engine`).
        """
        paths = [ckpt] if isinstance(ckpt, (str, os.PathLike)) else list(ckpt)
        checkpoint = load_checkpoint(paths[0])
        first = build_model(checkpoint, paths[0], "cpu")
        val_bleu = stored_val_bleu(checkpoint)
        del checkpoint
        ensemble = [first, *(load_model(p, "cpu") for p in paths[1:])]
        # CTranslate2's threads are fixed when it loads: from the service's worker thread one
        # runs faster than two (docs/serve.md), so one unless asked.
        decoder = open_engine(
            engine, ensemble, ct2_model=ct2_model, compute_type=compute_type,
            threads=(threads or 1) if engine == "ctranslate2" else threads, convert=convert,
        )  # fmt: skip
        return cls(
            ensemble, engine=decoder, engine_kind=engine, compute_type=compute_type,
            threads=threads, val_bleu=val_bleu, tgt_lang=tgt_lang,
        )  # fmt: skip

    def pin_threads(self, rows: int) -> None:
        """Torch's intra-op thread count for a call of ``rows`` rows, set on the calling
        (worker) thread: one for a small call, :attr:`threads` for a large one."""
        want = 1 if rows < ONE_THREAD_ROWS else max(1, self.threads)
        if torch.get_num_threads() != want:
            torch.set_num_threads(want)

    def source_tokens(self, lines: list[str]) -> int:
        """Source tokens of ``lines`` (``<eos>`` included, cut as the engine cuts them)."""
        limit = self.translator.limit
        ids = self.loaded.tokenizer.encode_src_batch([line.strip() for line in lines])
        return sum((len(s) if limit is None else min(len(s), limit)) + 1 for s in ids)

    def translate(
        self,
        lines: list[str],
        search: SearchConfig,
        *,
        prefixes: Sequence[str] | None = None,
        constraints: Sequence[Sequence[str]] | None = None,
        alignments: bool = False,
        should_stop: Callable[[], bool] | None = None,
        tgt_lang: str | None = None,
    ) -> list[Translation]:
        """One :class:`Translation` per line, in order, as ``transformer-mt-translate`` gives
        it (blocking). Once ``should_stop()`` is true, the search raises ``DecodingCancelled``
        at its next step (the ctranslate2 engine: its next batch)."""
        self.pin_threads(len(lines) * max(search.beam_size, search.nbest))
        with stop_when(should_stop):
            return self.translator_for(tgt_lang).translate_batch(
                lines, search, prefixes=prefixes, constraints=constraints, alignments=alignments
            )

    def translator_for(self, tgt_lang: str | None) -> Translator:
        """The translator into ``tgt_lang`` (``None``: the service's own language)."""
        return self.translator.into(tgt_lang)

    def attention(
        self, source: str, translation: str, *, tgt_lang: str | None = None
    ) -> dict[str, Any]:
        """Every attention weight of the torch model's teacher-forced pass over ``source`` ->
        ``translation``, whatever engine translates."""
        self.pin_threads(1)
        src_ids, out_ids = self._pair(source, translation, tgt_lang)
        maps = record_maps(self.loaded, src_ids, out_ids)
        tokenizer, tagged = self.loaded.tokenizer, self.translator_for(tgt_lang).tag_id is not None
        # What the model's limit cut, so that a client knows the maps show less than it sent.
        truncated = {
            "source": len(tokenizer.encode_src_batch([source.strip()])[0])
            - (len(src_ids) - tagged),
            "translation": len(tokenizer.encode_tgt_batch([translation.strip()])[0]) - len(out_ids),
        }
        # Rounded in float64, so that JSON writes "0.012" and not a float32's 17 digits.
        layers = {
            kind: [w.double().mul(1000).round().div(1000).tolist() for w in getattr(maps, kind)]
            for kind in KINDS
        }
        return {
            "source_tokens": maps.src_labels, "output_tokens": maps.out_labels,
            "input_tokens": maps.in_labels, "n_heads": self.loaded.config.n_heads,
            "truncated": truncated, **layers,
        }  # fmt: skip

    def _pair(self, source: str, translation: str, tgt_lang: str | None = None) -> Any:
        """The ids of ``source``, cut as for translation, and of ``translation``, cut to the
        model's positional limit (room for ``<bos>`` / ``<eos>``)."""
        (src_ids,) = self.translator_for(tgt_lang).encode([source], where="source")
        (out_ids,) = self.loaded.tokenizer.encode_tgt_batch([translation.strip()])
        return src_ids, out_ids[: self.loaded.config.max_len - 1]

    def attention_values(self, source: str, translation: str) -> int:
        """The weights :meth:`attention` returns for this pair, counted before it runs: every
        layer and head of encoder self-attention (S x S), decoder self-attention (T x T) and
        cross-attention (T x S), S and T the source and output pieces with ``<eos>``."""
        src_ids, out_ids = self._pair(source, translation)
        S, T, config = len(src_ids) + 1, len(out_ids) + 1, self.loaded.config
        per_head = config.n_encoder_layers * S * S + config.n_decoder_layers * (T * T + T * S)
        return config.n_heads * per_head

    def info(self) -> dict[str, Any]:
        """What ``GET /model`` shows: languages, size, decoding defaults, stored BLEU."""
        loaded, defaults = self.loaded, self.defaults
        own = None if self.needs_tgt_lang else self.translator.tgt_lang or loaded.tgt_lang
        return {
            "checkpoint": Path(loaded.path).name,
            "ensemble": [Path(m.path).name for m in self.ensemble],
            "src_lang": loaded.src_lang,
            "tgt_lang": own,
            "target_languages": loaded.tokenizer.target_languages or [loaded.tgt_lang],
            "engine": self.engine_kind,
            "compute_type": self.compute_type,
            "threads": self.threads,
            "parameters": sum(p.numel() for p in loaded.model.parameters()),
            "config": loaded.config.to_dict(),
            "decoding": {k: getattr(defaults, k) for k in DECODING_INFO},
            "val_bleu": self.val_bleu,
            "global_step": loaded.global_step,
        }
