"""The :class:`Translator`: batched translation and scoring with a checkpoint, in input order.

One output per input line, in order. Empty and whitespace-only lines give empty outputs;
sentences are sorted by length and batched by a token budget (or a sentence count), then put
back in input order, by the decode loop validation and evaluate.py use
(:mod:`transformer_mt.inference.decode`); a source longer than the checkpoint's
``data.max_len`` (or the model's positional ``max_len`` - 1) is cut with a warning. Byte-level
BPE encodes any Unicode text (emoji, CJK), so no input crashes the tokenizer. The command line
around it is :mod:`transformer_mt.cli.translate`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from transformer_mt.checkpoint import LoadedModel
from transformer_mt.data.batching import decode_sampler
from transformer_mt.data.collate import Collate, source_limit
from transformer_mt.errors import SettingError
from transformer_mt.inference.alignment import (
    ALIGNMENT_LAYER,
    ALIGNMENT_SHIFT,
    cross_attention,
    piece_words,
    word_alignment,
)
from transformer_mt.inference.decode import Engine, best_tokens, decode, progress_bar, score
from transformer_mt.inference.engine import TorchEngine
from transformer_mt.inference.search import Hypothesis, SearchConfig, Steering, check_stop

log = logging.getLogger(__name__)

#: Budget when neither the caller nor the checkpoint's data config gives one.
DEFAULT_MAX_TOKENS = 4096


#: What a decoding sweep (``evaluate.py -m ... decoding.beam_size=4,5,8``) leaves in its
#: sweep directory: the best setting, for ``decoding_from=`` / ``--decoding-from``.
BEST_DECODING = "best_decoding.yaml"


def decoding_from(path: str | Path | None) -> dict[str, Any]:
    """The ``decoding:`` settings of a decoding sweep's ``best_decoding.yaml`` ({} for None).

    ``path`` is the file or the sweep directory holding it.

    Raises:
        FileNotFoundError: no such file.
        ValueError: the file has no ``decoding:`` mapping.
    """
    if not path:
        return {}
    file = Path(path) / BEST_DECODING if Path(path).is_dir() else Path(path)
    if not file.is_file():
        raise FileNotFoundError(
            f"decoding file {file} not found; give the {BEST_DECODING} of a decoding sweep "
            "(python evaluate.py -m ckpt_path=... split=validation decoding.beam_size=4,5,8) or "
            "its sweep directory"
        )
    from omegaconf import OmegaConf

    content = OmegaConf.to_container(OmegaConf.load(file))
    decoding = content.get("decoding") if isinstance(content, dict) else None
    if not isinstance(decoding, dict):
        raise ValueError(f"{file} has no 'decoding:' mapping; is it a {BEST_DECODING}?")
    return {str(k): v for k, v in decoding.items()}


def _check_count(name: str, values: Sequence[Any], count: int) -> None:
    if len(values) != count:
        raise ValueError(
            f"{len(values)} {name} for {count} input lines; give one per line (an empty one "
            "where a line has none)"
        )


def _phrase_ids(tokenizer: Any, phrases: Sequence[str], line: int) -> list[list[int]]:
    """The ids of one line's constraint phrases (see :meth:`Translator.steering`)."""
    if any(not isinstance(p, str) or not p.strip() for p in phrases):
        raise ValueError(
            f"constraints of line {line + 1}: {list(phrases)!r} holds an empty phrase or one "
            'that is not text; give non-empty strings, e.g. ["Katzen", "im Garten"]'
        )
    return tokenizer.encode_tgt_batch([" " + " ".join(p.split()) for p in phrases])


@dataclass(frozen=True)
class Candidate:
    """One hypothesis as text: its detokenized text, score and target tokens (subwords), and
    its word alignment to the source (Pharaoh pairs, when asked for)."""

    text: str
    score: float
    tokens: list[str]
    alignment: list[tuple[int, int]] | None = None


@dataclass(frozen=True)
class Translation:
    """The translation of one line: its n-best list, best first (one entry without n-best)."""

    source: str
    hypotheses: list[Candidate]

    @property
    def text(self) -> str:
        return self.hypotheses[0].text

    @property
    def score(self) -> float:
        return self.hypotheses[0].score


def target_tag(loaded: LoadedModel, tgt_lang: str | None) -> tuple[str | None, int | None]:
    """The target language and its tag id for ``loaded`` (``None`` id: a bilingual model).

    A multilingual model needs a target language unless it has only one; a bilingual one
    takes ``tgt_lang`` only when it is the one it translates into.

    Raises:
        SettingError: a language the model was not trained for, or none for a model that
            translates into several.
    """
    tok = loaded.tokenizer
    known = tok.target_languages
    if not known:
        if tgt_lang is not None and loaded.tgt_lang not in (None, tgt_lang):
            raise SettingError(
                f"{loaded.path} translates into {loaded.tgt_lang} only, not {tgt_lang}",
                [("tgt_lang", loaded.tgt_lang)],
                lead="use",
                tail="or another checkpoint",
            )
        return loaded.tgt_lang, None
    if tgt_lang is None:
        if len(known) > 1:
            raise SettingError(
                f"{loaded.path} translates into {', '.join(known)}: choose one",
                [("tgt_lang", known[0])],
                lead="e.g.",
            )
        tgt_lang = known[0]
    if tgt_lang not in known:
        raise SettingError(
            f"{loaded.path} was not trained to translate into {tgt_lang}; it translates into "
            f"{', '.join(known)}",
            [("tgt_lang", known[0])],
            lead="use e.g.",
        )
    return tgt_lang, tok.tag_id(tgt_lang)


class Translator:
    """Batched translation with a loaded checkpoint (or an ensemble), through the decode loop.

    Sources are cut like the test split of training (:func:`source_limit` of the stored
    ``data.max_len`` and the model's ``max_len``) and batched like it (the stored
    ``data.eval_max_tokens`` is the default budget), so translating a test set gives the
    hypotheses evaluate.py and the trainer score.

    Args:
        loaded: the model and tokenizer (:func:`transformer_mt.checkpoint.load_model`), or
            several checkpoints sharing one tokenizer: an ensemble (the first one's stored
            decoding and data config are the defaults).
        search: default decoding options (beam_size 1 = greedy).
        max_tokens: padded source tokens per batch (default when neither bound is given: the
            checkpoint's ``data.eval_max_tokens``, else 4096).
        max_sentences: sentences per batch (instead of, or on top of, ``max_tokens``).
        engine: the :class:`~transformer_mt.inference.decode.Engine` (default: our torch
            search over the loaded model(s); :func:`~transformer_mt.inference.engine.open_engine`
            builds the others).
    """

    def __init__(
        self,
        loaded: LoadedModel | Sequence[LoadedModel],
        search: SearchConfig | None = None,
        max_tokens: int | None = None,
        max_sentences: int | None = None,
        *,
        engine: Engine | None = None,
        tgt_lang: str | None = None,
    ) -> None:
        for name, value in (("max_tokens", max_tokens), ("max_sentences", max_sentences)):
            if value is not None and value < 1:
                raise SettingError(f"{name} must be >= 1, got {value}", [(name, 1)], tail="or more")
        models = [loaded] if isinstance(loaded, LoadedModel) else list(loaded)
        self.loaded, self.tokenizer = models[0], models[0].tokenizer
        self.engine = engine if engine is not None else TorchEngine.from_loaded(models)
        self.search = search or SearchConfig.from_stored(self.loaded.decoding)
        data = self.loaded.data_config()
        if max_tokens is None and max_sentences is None:
            max_tokens = DEFAULT_MAX_TOKENS if data is None else data.eval_max_tokens
        self.max_tokens, self.max_sentences = max_tokens, max_sentences
        #: source ids kept per sentence: the rule of every decoding path
        self.model_max_len = min(m.config.max_len for m in models)
        self.limit = source_limit(None if data is None else data.max_len, self.model_max_len)
        tok = self.tokenizer
        self.collate = Collate(tok.pad_id, tok.bos_id, tok.eos_id, self.limit)
        self.tgt_lang, self.tag_id = target_tag(self.loaded, tgt_lang)
        self._models, self._siblings = models, {self.tgt_lang: self}

    def into(self, tgt_lang: str | None) -> Translator:
        """The translator into ``tgt_lang`` (a multilingual model's other targets), made once:
        the same models, engine, search and batch size; ``None``: this one."""
        if tgt_lang is None:
            return self
        if tgt_lang not in self._siblings:
            self._siblings[tgt_lang] = Translator(
                self._models, self.search, self.max_tokens, self.max_sentences,
                engine=self.engine, tgt_lang=tgt_lang,
            )  # fmt: skip
        return self._siblings[tgt_lang]

    @property
    def device(self) -> torch.device:
        return self.loaded.device

    def encode(self, lines: Sequence[str], where: str = "input") -> list[list[int]]:
        """Source ids per line (no ``<eos>``); over-long lines are cut with a warning."""
        ids = self.tokenizer.encode_src_batch([line.strip() for line in lines])
        limit = self.limit
        if self.tag_id is not None:  # a multilingual model: the target tag leads every row
            limit = None if limit is None else limit - 1
        long_lines = [i for i, seq in enumerate(ids) if limit is not None and len(seq) > limit]
        for i in long_lines[:5]:
            log.warning(
                "%s line %d has %d tokens, more than the %d a sentence may have (data.max_len, "
                "or the model's max_len - 1): truncated",
                where,
                i + 1,
                len(ids[i]),
                limit,
            )
        if len(long_lines) > 5:
            log.warning("... %d long lines truncated in all", len(long_lines))
        if self.tag_id is not None:
            return [[self.tag_id, *seq[:limit]] for seq in ids]
        return [seq[:limit] for seq in ids]

    def batches(
        self,
        ids: Sequence[Sequence[int]],
        targets: Sequence[Sequence[int]] | None = None,
        steer: Steering | None = None,
    ) -> Iterator[dict[str, Any]]:
        """Collated batches of ``ids`` (and ``targets``) in the order every decoding path uses.

        With targets (forced decoding), the budget counts the longer side of each pair.
        ``steer`` (per line) travels with each batch as ``prefix_ids``/``constraint_ids``.
        """
        limit = self.limit
        lengths = [(len(s) if limit is None else min(len(s), limit)) + 1 for s in ids]  # + <eos>
        if targets is not None:
            lengths = [max(n, len(t) + 1) for n, t in zip(lengths, targets)]
        for batch in decode_sampler(lengths, self.max_tokens, self.max_sentences):
            check_stop()  # between engine batches: an engine without a per-step check stops here
            columns: dict[str, Any] = {"src_ids": [ids[i] for i in batch], "index": batch}
            if targets is not None:
                columns["tgt_ids"] = [targets[i] for i in batch]
            for column, values in (
                ("prefix_ids", steer and steer.prefixes),
                ("constraint_ids", steer and steer.constraints),
            ):
                if values is not None:
                    columns[column] = [values[i] for i in batch]
            yield self.collate(columns)

    def decode_ids(
        self,
        ids: Sequence[Sequence[int]],
        search: SearchConfig | None = None,
        *,
        steer: Steering | None = None,
        progress: bool = False,
    ) -> list[list[Hypothesis]]:
        """The n-best list of each source id list, in order (``search``: default the
        translator's; ``steer``: per-line prefixes and constraints, as ids). Empty sources give
        one empty hypothesis without running the model."""
        if not ids:
            return []
        batches = self.batches(ids, steer=steer)
        with progress_bar(progress, len(ids)) as advance:
            return decode(self.engine, batches, search or self.search, advance)

    def translate_ids(
        self, ids: Sequence[Sequence[int]], progress: bool = False
    ) -> list[list[int]]:
        """Output ids (no ``<bos>``, cut before ``<eos>``) of the best hypothesis, in order."""
        return best_tokens(self.decode_ids(ids, progress=progress))

    def translate_batch(
        self,
        lines: Sequence[str],
        search: SearchConfig | None = None,
        *,
        prefixes: Sequence[str] | None = None,
        constraints: Sequence[Sequence[str]] | None = None,
        alignments: bool = False,
        progress: bool = False,
    ) -> list[Translation]:
        """Each line's :class:`Translation` (text, score and the ``search.nbest`` best), in order.

        ``search`` overrides the translator's default for this call (e.g. per request);
        ``prefixes`` (one per line, ``""`` for none) start the outputs, ``constraints`` (phrases
        per line) must appear in them; ``alignments`` adds each hypothesis' word alignment.
        """
        src_ids = self.encode(lines)
        steer = self.steering(len(lines), prefixes, constraints)
        nbest_lists = self.decode_ids(src_ids, search, steer=steer, progress=progress)
        flat = [h for hyps in nbest_lists for h in hyps]
        texts = iter(self.tokenizer.decode_hypotheses([h.tokens for h in flat]))
        links = iter(
            self.align([s for s, hyps in zip(src_ids, nbest_lists) for _ in hyps],
                       [h.tokens for h in flat])
            if alignments else [None] * len(flat)
        )  # fmt: skip
        vocab = self.tokenizer.tgt
        return [
            Translation(
                line,
                [
                    Candidate(
                        next(texts), h.score, [vocab.id_to_token(t) for t in h.tokens], next(links)
                    )
                    for h in hyps
                ],
            )
            for line, hyps in zip(lines, nbest_lists)
        ]

    def steering(
        self,
        count: int,
        prefixes: Sequence[str] | None = None,
        constraints: Sequence[Sequence[str]] | None = None,
    ) -> Steering | None:
        """Target prefixes and constraint phrases of ``count`` lines as ids (checked).

        A prefix is encoded as the output's start; a phrase with a leading space, as it
        stands inside a sentence (at the start of an output the space is stripped).

        Raises:
            ValueError: not one entry per line, an empty phrase, or more target tokens than
                the model can generate.
        """
        if prefixes is None and constraints is None:
            return None
        room = self.model_max_len - 2  # <bos>, <eos>
        tok = self.tokenizer
        prefix_ids = None
        if prefixes is not None:
            _check_count("prefixes", prefixes, count)
            prefix_ids = tok.encode_tgt_batch([p.strip() for p in prefixes])
        constraint_ids = None
        if constraints is not None:
            _check_count("constraints", constraints, count)
            constraint_ids = [_phrase_ids(tok, phrases, n) for n, phrases in enumerate(constraints)]
        for n in range(count):
            used = len(prefix_ids[n]) if prefix_ids else 0
            used += sum(map(len, constraint_ids[n])) if constraint_ids else 0
            if used > room:
                raise ValueError(
                    f"line {n + 1}: its prefix and constraints have {used} target tokens, more "
                    f"than the {room} an output of this model can hold; shorten them"
                )
        return Steering(prefix_ids, constraint_ids)

    @torch.no_grad()
    def align(
        self,
        sources: Sequence[Sequence[int]],
        outputs: Sequence[Sequence[int]],
        *,
        layer: int = ALIGNMENT_LAYER,
        shift: int = ALIGNMENT_SHIFT,
    ) -> list[list[tuple[int, int]]]:
        """The word alignment (Pharaoh pairs) of each output to its source, from the first
        model's cross-attention (:mod:`~transformer_mt.inference.alignment`), whatever engine
        decoded it. ``layer``/``shift``: another reading of the attention, for the study that
        chose the defaults (``scripts/alignment_check.py``)."""
        model, tok = self.loaded.model, self.tokenizer
        found: dict[int, list[tuple[int, int]]] = {}
        for batch in self.batches(sources, outputs):
            src, tgt = batch["src"].to(self.device), batch["tgt"].to(self.device)
            weights = cross_attention(model, src, tgt[:, :-1], layer)  # (B, T, S)
            for b, index in enumerate(batch["index"].tolist()):
                src_words = piece_words([tok.src.id_to_token(i) for i in sources[index]])
                out_words = piece_words([tok.tgt.id_to_token(i) for i in outputs[index]])
                found[index] = word_alignment(weights[b], src_words, out_words, shift)
        return [found[i] for i in range(len(sources))]

    def translate(self, lines: Sequence[str], progress: bool = False) -> list[str]:
        """One translation per line, in order; never a line break inside a translation."""
        return self.tokenizer.decode_hypotheses(self.translate_ids(self.encode(lines), progress))

    def score_ids(
        self,
        sources: Sequence[Sequence[int]],
        targets: Sequence[Sequence[int]],
        *,
        progress: bool = False,
    ) -> list[list[float]]:
        """Log-probability of each target token (``<eos>`` last) given its source, in order.

        Forced decoding, batched like translation; sources are cut to :attr:`limit` by the
        collate, targets must fit the model (at most ``max_len - 1`` ids).
        """
        with progress_bar(progress, len(sources), "scoring") as advance:
            return score(self.engine, self.batches(sources, targets), advance)

    def log_probs(
        self, sources: Sequence[Sequence[int]], outputs: Sequence[Sequence[int]]
    ) -> list[float]:
        """Model log-probability of each output (``<eos>`` included) given its source."""
        return [sum(token_scores) for token_scores in self.score_ids(sources, outputs)]
