"""The model behind the service: one checkpoint, one decoding engine, options per request.

:class:`ServedModel` is built once at start-up and then called from the batcher's one worker
thread only, so the model, its KV caches and the attention recorder's hooks are never used by
two calls at once. A translation takes the path ``transformer-mt-translate`` takes with the
same options: :func:`~transformer_mt.inference.translate.search_config` over the checkpoint's
stored decoding, the :class:`~transformer_mt.inference.translate.Translator` (torch) or the
CTranslate2 engine, the same source cut and the same tokenizer.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from transformer_mt.checkpoint import build_model, load_checkpoint, load_model
from transformer_mt.inference.attention_maps import KINDS, record_maps
from transformer_mt.inference.averaging import stored_val_bleu
from transformer_mt.inference.engine import open_engine
from transformer_mt.inference.search import SearchConfig
from transformer_mt.inference.translate import Translation, Translator, search_config


@dataclass(frozen=True)
class Options:
    """Decoding options of one request; ``None`` means the checkpoint's stored default.

    Frozen (hashable): requests with equal options share an engine call.
    """

    beam_size: int | None = None
    length_penalty: float | None = None
    nbest: int | None = None


class ServedModel:
    """A checkpoint ready to serve: translation through one engine, attention through torch.

    Args:
        ckpt: the checkpoint (.ckpt) written by train.py, or several sharing one tokenizer: an
            ensemble (torch engine; the first one's decoding defaults, stored BLEU and attention).
        engine: ``"torch"`` or ``"ctranslate2"``.
        ct2_model: a directory written by ``transformer-mt-export --format ctranslate2`` (else
            the checkpoint is converted at start-up).
        compute_type: CTranslate2 weights (``int8``, ``float32``, ...).
        threads: intra-op threads of the engine (0 = the library's default).
        max_tokens: padded source tokens per engine batch (default: the checkpoint's
            ``data.eval_max_tokens``, as for ``transformer-mt-translate``).
    """

    def __init__(
        self,
        ckpt: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
        *,
        engine: str = "torch",
        ct2_model: str | os.PathLike[str] | None = None,
        compute_type: str | None = None,
        threads: int = 0,
        max_tokens: int | None = None,
    ) -> None:
        paths = [ckpt] if isinstance(ckpt, (str, os.PathLike)) else list(ckpt)
        checkpoint = load_checkpoint(paths[0])
        self.loaded = build_model(checkpoint, paths[0], "cpu")
        self.val_bleu = stored_val_bleu(checkpoint)
        del checkpoint
        self.ensemble = [self.loaded, *(load_model(p, "cpu") for p in paths[1:])]
        self.engine = engine
        self.defaults = search_config(self.loaded.decoding)
        decoder = open_engine(
            engine, self.ensemble, ct2_model=ct2_model, compute_type=compute_type, threads=threads
        )
        self.translator = Translator(self.ensemble, self.defaults, max_tokens, engine=decoder)
        self.compute_type = compute_type or ("default" if engine != "torch" else None)
        self.threads = threads

    def _pin_threads(self) -> None:
        """Torch's intra-op thread count, set on the calling (worker) thread."""
        if self.threads > 0 and torch.get_num_threads() != self.threads:
            torch.set_num_threads(self.threads)

    @property
    def tokenizer(self) -> Any:
        return self.loaded.tokenizer

    def search(self, options: Options) -> SearchConfig:
        """The search of ``transformer-mt-translate --beam-size B --length-penalty A``."""
        return search_config(
            self.loaded.decoding,
            beam_size=options.beam_size,
            length_penalty=options.length_penalty,
            nbest=options.nbest,
        )

    def source_tokens(self, lines: list[str]) -> int:
        """Source tokens of ``lines`` (``<eos>`` included, cut as the engine cuts them)."""
        limit = self.translator.limit
        ids = self.tokenizer.encode_src_batch([line.strip() for line in lines])
        return sum((len(s) if limit is None else min(len(s), limit)) + 1 for s in ids)

    def translate(self, lines: list[str], options: Options) -> list[Translation]:
        """One :class:`Translation` (n-best list, scores) per line, in order (blocking: call it
        from the worker thread)."""
        search = self.search(options)
        self._pin_threads()
        return self.translator.translate_batch(lines, search)

    def attention(self, source: str, translation: str) -> dict[str, Any]:
        """Every attention weight of a teacher-forced pass over ``source`` -> ``translation``.

        The weights are the torch model's own (whatever engine translates); the source is cut
        as for translation, the output to the model's positional limit.
        """
        tok = self.tokenizer
        self._pin_threads()
        (src_ids,) = self.translator.encode([source], where="source")
        (out_ids,) = tok.encode_tgt_batch([translation.strip()])
        out_ids = out_ids[: self.loaded.config.max_len - 1]  # room for <bos> / <eos>
        maps = record_maps(self.loaded, src_ids, out_ids)
        layers = {
            kind: [w.mul(1000).round().div(1000).tolist() for w in getattr(maps, kind)]
            for kind in KINDS
        }
        return {
            "source_tokens": maps.src_labels,
            "output_tokens": maps.out_labels,
            "input_tokens": maps.in_labels,
            "n_heads": self.loaded.config.n_heads,
            **layers,
        }

    def info(self) -> dict[str, Any]:
        """What ``GET /model`` shows: languages, size, decoding defaults, stored BLEU."""
        loaded, config = self.loaded, self.loaded.config
        return {
            "checkpoint": Path(loaded.path).name,
            "ensemble": [Path(m.path).name for m in self.ensemble],
            "src_lang": loaded.src_lang,
            "tgt_lang": loaded.tgt_lang,
            "engine": self.engine,
            "compute_type": self.compute_type,
            "parameters": sum(p.numel() for p in loaded.model.parameters()),
            "config": config.to_dict(),
            "decoding": {
                "beam_size": self.defaults.beam_size,
                "length_penalty": self.defaults.length_penalty,
                "length_norm": self.defaults.length_norm,
                "max_len_a": self.defaults.max_len_a,
                "max_len_b": self.defaults.max_len_b,
            },
            "val_bleu": self.val_bleu,
            "global_step": loaded.global_step,
        }
