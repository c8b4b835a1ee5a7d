"""The model behind the service: one checkpoint, one decoding engine, a search per request.

:class:`ServedModel` is built once at start-up and then called from the batcher's worker
threads: :attr:`ServedModel.lanes` translations may run at once (the model's forward keeps no
state between calls, and each search has its own KV caches), while an attention pass, whose
hooks record every call through the model, runs with nothing beside it. A translation takes
the path ``transformer-mt-translate`` takes with the same options:
:meth:`SearchConfig.from_stored` over the checkpoint's stored decoding, the
:class:`~transformer_mt.inference.translator.Translator` over the engine (torch or
CTranslate2), the same source cut and the same tokenizer.
"""

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
from transformer_mt.serve.workers import WorkerPool, WorkerSpec

#: Engine calls with fewer rows (sentences x beams) run on one intra-op thread: a small call's
#: operations are too small to share, and waking a second thread for each of them cost more
#: than it gained (docs/serve.md, "Where a lone request's time goes").
ONE_THREAD_ROWS = 32


class ServedModel:
    """A checkpoint ready to serve: translation through one engine, attention through torch.

    Args:
        ensemble: the loaded checkpoint, or several sharing one tokenizer (the first one's
            decoding defaults and attention serve).
        engine: the engine that translates (default: torch over ``ensemble``).
        engine_kind: its name for ``GET /model`` (``"torch"``, ``"ctranslate2"``).
        compute_type: the engine's weights (``default``, ``int8``, ...), for ``GET /model``.
        threads: intra-op threads of the engine's large calls (0 = the library's default),
            shared by the lanes; calls of fewer than :data:`ONE_THREAD_ROWS` rows run on one
            thread.
        lanes: translations that may run at once (0 = one); a CTranslate2 engine must have
            been loaded with as many ``inter_threads``.
        pool: worker processes that run the translations (:mod:`~transformer_mt.serve.workers`;
            one lane each); this process then keeps tokenisation, checks and attention.
        max_tokens: padded source tokens per engine batch (default: the checkpoint's
            ``data.eval_max_tokens``, as for ``transformer-mt-translate``).
        val_bleu: the validation BLEU the checkpoint stores, for ``GET /model``.
        compiled: the torch engine decodes through its compiled step, for ``GET /model``.
    """

    def __init__(
        self,
        ensemble: Sequence[LoadedModel],
        *,
        engine: Engine | None = None,
        engine_kind: str = "torch",
        compute_type: str | None = None,
        threads: int = 0,
        lanes: int = 0,
        max_tokens: int | None = None,
        val_bleu: float | None = None,
        tgt_lang: str | None = None,
        pool: WorkerPool | None = None,
        compiled: bool = False,
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
        self._max_tokens = max_tokens
        # One translator per target language a request asks for; they share the engine.
        self._translators = {self.translator.tgt_lang: self.translator}
        self.engine = self.translator.engine
        self.engine_kind = engine_kind
        self.compute_type = compute_type or "default"
        self.threads = threads or torch.get_num_threads()
        #: engine worker processes that translate in this process' place (``None``: none)
        self.pool = pool
        #: the torch engine decodes through its compiled step (here or in every worker)
        self.compiled = compiled
        self.lanes = pool.count if pool is not None else lanes or 1
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
        lanes: int = 0,
        convert: Converter | None = None,
        tgt_lang: str | None = None,
        workers: int = 0,
        compile: bool = False,
    ) -> ServedModel:
        """Load ``ckpt`` (each file read once, on the CPU) and open the engine ``engine``.

        ``ct2_model``: a directory of ``transformer-mt-export --format ctranslate2``; else
        ``convert`` writes one at start-up (:func:`~transformer_mt.inference.engine.open_engine`).
        ``workers``: engine worker processes that translate (0 = none: this process does),
        each with its share of ``threads`` (the cores when 0) and one lane; they open the same
        engine, after this process has opened it once (a bad option is found once, a converted
        CTranslate2 model written once). ``compile``: the torch engine's compiled decoding step,
        compiled before the first request for each thread count a call may run on.
        """
        if workers and lanes > 1:
            raise ValueError(f"--workers {workers} and --lanes {lanes}: each worker is one lane; "
                             "set one of them")  # fmt: skip
        paths = [ckpt] if isinstance(ckpt, (str, os.PathLike)) else list(ckpt)
        checkpoint = load_checkpoint(paths[0])
        first = build_model(checkpoint, paths[0], "cpu")
        val_bleu = stored_val_bleu(checkpoint)
        del checkpoint
        ensemble = [first, *(load_model(p, "cpu") for p in paths[1:])]
        # CTranslate2's threads are fixed when it loads: from the service's worker thread one ran
        # faster than two at every batch size measured. Its lanes are its inter_threads; one
        # unless asked: two lanes on two cores served no more than one (docs/serve.md).
        ct2_threads, lanes = threads or 1, lanes or 1
        decoder = open_engine(
            engine, ensemble, ct2_model=ct2_model, compute_type=compute_type,
            threads=ct2_threads if engine == "ctranslate2" else threads, convert=convert,
            lanes=lanes if engine == "ctranslate2" else None, compile=compile and not workers,
        )  # fmt: skip
        pool = None
        if workers:
            model_dir = getattr(decoder, "model_dir", None)
            spec = WorkerSpec(
                cls.open, tuple(str(p) for p in paths), engine=engine, compute_type=compute_type,
                ct2_model=str(model_dir) if model_dir is not None else None,
                threads=max(1, (threads or torch.get_num_threads()) // workers),
                tgt_lang=tgt_lang, compile=compile,
            )  # fmt: skip
            pool = WorkerPool(spec, workers)
        served = cls(
            ensemble, engine=decoder, engine_kind=engine, compute_type=compute_type,
            threads=threads, lanes=lanes, val_bleu=val_bleu, tgt_lang=tgt_lang, pool=pool,
            compiled=compile,
        )  # fmt: skip
        if compile and not workers:  # (workers compile their own)
            served._compile()
        return served

    def _compile(self) -> None:
        """Compile the torch engine's decoding step for the calls :meth:`translate` makes:
        small ones (a lone sentence, and batches) and large ones, each on its threads."""
        engine: Any = self.engine  # the torch engine (compile is refused for the others)
        engine.warm_up([self._threads_for(1)])
        engine.warm_up([self._threads_for(ONE_THREAD_ROWS)], rows=[ONE_THREAD_ROWS])

    def close(self) -> None:
        """Stop the worker processes, if any (the model itself needs no closing)."""
        if self.pool is not None:
            self.pool.close()

    def _threads_for(self, rows: int) -> int:
        """The thread count :meth:`pin_threads` sets for a call of ``rows`` rows."""
        return 1 if rows < ONE_THREAD_ROWS else max(1, self.threads // self.lanes)

    def pin_threads(self, rows: int) -> None:
        """Torch's intra-op thread count for a call of ``rows`` rows, set on the calling
        (worker) thread: one for a small call, the lane's share of :attr:`threads` for a large
        one (the lanes together never ask for more threads than there are). :meth:`translate`
        sets it; a caller timing the engine itself sets it the same way."""
        want = self._threads_for(rows)
        if torch.get_num_threads() != want:
            torch.set_num_threads(want)

    @property
    def tokenizer(self) -> Any:
        return self.loaded.tokenizer

    def search(
        self,
        *,
        beam_size: int | None = None,
        length_penalty: float | None = None,
        nbest: int | None = None,
        sampling_topk: int | None = None,
        sampling_topp: float | None = None,
        temperature: float | None = None,
        seed: int | None = None,
    ) -> SearchConfig:
        """The search of ``transformer-mt-translate`` with the same flags (``--beam-size``,
        ``--sampling-topk``, ...); ``None`` keeps the checkpoint's stored value, and sampling
        replaces a stored beam search (:meth:`SearchConfig.from_stored`).

        Raises:
            SettingError: a combination that cannot work (sampling with a beam, a seed without
                sampling, top-p outside (0, 1], ...).
        """
        return SearchConfig.from_stored(
            self.loaded.decoding, beam_size=beam_size, length_penalty=length_penalty,
            nbest=nbest, sampling_topk=sampling_topk, sampling_topp=sampling_topp,
            temperature=temperature, seed=seed,
        )  # fmt: skip

    def source_tokens(self, lines: list[str]) -> int:
        """Source tokens of ``lines`` (``<eos>`` included, cut as the engine cuts them)."""
        limit = self.translator.limit
        ids = self.tokenizer.encode_src_batch([line.strip() for line in lines])
        return sum((len(s) if limit is None else min(len(s), limit)) + 1 for s in ids)

    def check_steering(
        self,
        count: int,
        prefixes: Sequence[str] | None = None,
        constraints: Sequence[Sequence[str]] | None = None,
    ) -> None:
        """Refuse prefixes and constraints of ``count`` lines that :meth:`translate` would
        refuse, before any work is queued (tokenizing them is cheap).

        Raises:
            ValueError: not one per line, an empty phrase, or more target tokens than an
                output of the model can hold.
        """
        self.translator.steering(count, prefixes, constraints)

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
        """One :class:`Translation` (n-best list, scores) per line, in order (blocking: call it
        from the worker thread). ``prefixes`` start the outputs and ``constraints`` must appear
        in them (one entry per line), ``alignments`` adds each hypothesis' word alignment: as
        ``transformer-mt-translate --prefix-file/--constraints-file/--alignments``.

        ``should_stop`` is asked once per decoding step of the torch search (once per engine
        batch of the ctranslate2 engine); once it is true the call raises
        :class:`~transformer_mt.inference.search.DecodingCancelled`.
        """
        if self.pool is not None:
            return self.pool.translate(
                lines, search, should_stop=should_stop, prefixes=prefixes,
                constraints=constraints, alignments=alignments, tgt_lang=tgt_lang,
            )  # fmt: skip
        self.pin_threads(len(lines) * max(search.beam_size, search.nbest))
        with stop_when(should_stop):
            return self.translator_for(tgt_lang).translate_batch(
                lines, search, prefixes=prefixes, constraints=constraints, alignments=alignments
            )

    def translator_for(self, tgt_lang: str | None) -> Translator:
        """The translator into ``tgt_lang`` (``None``: the service's own language)."""
        if tgt_lang is None or tgt_lang == self.translator.tgt_lang:
            return self.translator
        if tgt_lang not in self._translators:
            self._translators[tgt_lang] = Translator(
                self.ensemble,
                self.defaults,
                max_tokens=self._max_tokens,
                engine=self.engine,
                tgt_lang=tgt_lang,
            )
        return self._translators[tgt_lang]

    def attention(
        self, source: str, translation: str, *, tgt_lang: str | None = None
    ) -> dict[str, Any]:
        """Every attention weight of a teacher-forced pass over ``source`` -> ``translation``.

        The weights are the torch model's own (whatever engine translates); the source is cut
        as for translation, the output to the model's positional limit.
        """
        tok = self.tokenizer
        self.pin_threads(1)
        (src_ids,) = self.translator_for(tgt_lang).encode([source], where="source")
        (out_ids,) = tok.encode_tgt_batch([translation.strip()])
        out_ids = out_ids[: self.loaded.config.max_len - 1]  # room for <bos> / <eos>
        maps = record_maps(self.loaded, src_ids, out_ids)
        # Rounded in float64, so that JSON writes "0.012": a float32 0.012 is 0.012000000104308128,
        # three times the bytes of the whole answer.
        layers = {
            kind: [w.double().mul(1000).round().div(1000).tolist() for w in getattr(maps, kind)]
            for kind in KINDS
        }
        return {
            "source_tokens": maps.src_labels,
            "output_tokens": maps.out_labels,
            "input_tokens": maps.in_labels,
            "n_heads": self.loaded.config.n_heads,
            **layers,
        }

    def attention_values(self, source: str, translation: str) -> int:
        """The weights :meth:`attention` returns for this pair, counted before it runs: every
        layer and head of encoder self-attention (S x S), decoder self-attention (T x T) and
        cross-attention (T x S), S and T the source and output pieces with ``<eos>``."""
        (src_ids,) = self.translator.encode([source], where="source")
        (out_ids,) = self.tokenizer.encode_tgt_batch([translation.strip()])
        S, T = len(src_ids) + 1, min(len(out_ids), self.loaded.config.max_len - 1) + 1
        config = self.loaded.config
        per_head = config.n_encoder_layers * S * S + config.n_decoder_layers * (T * T + T * S)
        return config.n_heads * per_head

    def info(self) -> dict[str, Any]:
        """What ``GET /model`` shows: languages, size, decoding defaults, stored BLEU."""
        loaded, config = self.loaded, self.loaded.config
        return {
            "checkpoint": Path(loaded.path).name,
            "ensemble": [Path(m.path).name for m in self.ensemble],
            "src_lang": loaded.src_lang,
            "tgt_lang": None
            if self.needs_tgt_lang
            else self.translator.tgt_lang or loaded.tgt_lang,
            "target_languages": loaded.tokenizer.target_languages or [loaded.tgt_lang],
            "engine": self.engine_kind,
            "compute_type": self.compute_type,
            "compiled": self.compiled,
            "threads": self.threads,
            "lanes": self.lanes,
            "workers": self.pool.count if self.pool is not None else 0,
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
