"""The service behind the routes: a request's options turned into a search and steering, its
sizes checked, its work queued with the batcher. Each refusal is an :class:`ApiError`."""

from __future__ import annotations

from collections.abc import Awaitable, Iterable
from dataclasses import dataclass
from typing import Any

from transformer_mt.errors import SettingError
from transformer_mt.inference.ctranslate2_engine import check_ct2_search
from transformer_mt.inference.search import SearchConfig
from transformer_mt.inference.translator import Translation
from transformer_mt.serve.batcher import Batcher
from transformer_mt.serve.limits import Limits
from transformer_mt.serve.model import ServedModel
from transformer_mt.serve.schemas import (
    SAMPLING_FIELDS,
    AttentionRequest,
    DecodingFields,
    TranslateRequest,
    spell,
)
from transformer_mt.serve.timing import Stopwatch


class ApiError(Exception):
    """An answer other than 200: the status and the one-line message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class CallOptions:
    """What one engine call decodes with. Hashable: the batcher gives jobs with equal options
    (and steering columns) one call."""

    search: SearchConfig
    alignments: bool = False
    tgt_lang: str | None = None


def _given(values: list[Any]) -> bool:
    """A prefix or constraint list that asks for something (not only empty entries)."""
    return any(v.strip() if isinstance(v, str) else v for v in values)


class Service:
    """The routes' shared state: the served model, its limits and the batcher."""

    def __init__(self, model: ServedModel, limits: Limits) -> None:
        self.model, self.limits = model, limits
        self.batcher = Batcher(
            self._run,
            max_tokens=limits.batch_tokens,
            window_s=limits.window_ms / 1000,
            max_pending=limits.max_pending,
        )

    def _run(self, lines: list[str], options: CallOptions, *, stop: Any, **columns: Any) -> Any:
        """The batcher's engine call, on its worker thread."""
        return self.model.translate(
            lines, options.search, alignments=options.alignments, should_stop=stop.is_set,
            tgt_lang=options.tgt_lang, **columns,
        )  # fmt: skip

    def target(self, request: DecodingFields) -> str | None:
        """The request's target language, checked against the model's."""
        lang = request.tgt_lang
        if lang is None and not self.model.needs_tgt_lang:
            return None
        loaded = self.model.loaded
        known = loaded.tokenizer.target_languages or [loaded.tgt_lang]
        if lang is None:
            raise ApiError(
                422,
                f"this model translates into {', '.join(known)}: set tgt_lang in the request "
                "(or start the service with --tgt-lang)",
            )
        if lang not in known:
            raise ApiError(
                422,
                f"tgt_lang {lang!r} is not a language this model translates into; it "
                f"translates into {', '.join(str(k) for k in known)}",
            )
        return lang

    def search(self, request: DecodingFields) -> SearchConfig:
        """The request's search over the checkpoint's stored one, as ``transformer-mt-translate``
        builds it from the same flags."""
        beam, alpha = request.beam_size, request.length_penalty
        nbest = getattr(request, "nbest", None)
        if beam is not None and not 1 <= beam <= self.limits.max_beam:
            raise ApiError(422, f"beam_size must be 1..{self.limits.max_beam}, got {beam}")
        if alpha is not None and not 0.0 <= alpha <= 10.0:
            raise ApiError(422, f"length_penalty must be between 0 and 10, got {alpha}")
        sampling = request.sampling_topk is not None or request.sampling_topp is not None
        if nbest is not None:
            self._check_nbest(nbest, beam, sampling=sampling)
        sample = {name: getattr(request, name) for name in SAMPLING_FIELDS}
        try:
            search = SearchConfig.from_stored(
                self.model.loaded.decoding, beam_size=beam, length_penalty=alpha, nbest=nbest,
                **sample,
            )  # fmt: skip
            if self.model.engine_kind == "ctranslate2":
                check_ct2_search(search)
        except SettingError as err:
            raise ApiError(422, err.render(spell)) from None
        except ValueError as err:
            raise ApiError(422, str(err)) from None
        return search

    def _check_nbest(self, nbest: int, beam: int | None, *, sampling: bool) -> None:
        """``nbest`` within the beam; with sampling, the samples per sentence, within
        ``max_beam`` (the work a beam of that size would cost)."""
        if sampling:
            most = self.limits.max_beam
            if not 1 <= nbest <= most:
                raise ApiError(
                    422,
                    f"nbest (the samples drawn per sentence) must be 1..{most}, got {nbest}; ask "
                    "for fewer samples",
                )
            return
        width = beam if beam is not None else self.model.defaults.beam_size
        if not 1 <= nbest <= width:
            raise ApiError(
                422, f"nbest must be 1..beam_size ({width}), got {nbest}; ask for a wider beam"
            )

    def steering(self, body: TranslateRequest, search: SearchConfig) -> dict[str, list[Any]]:
        """The request's prefixes and constraints as the batcher's per-line columns, checked
        before any work is queued; a list of empty entries only asks for nothing."""
        count = len(body.text)
        columns: dict[str, list[Any]] = {}
        for field, name, values, empty in (
            ("prefix", "prefixes", body.prefix, '""'),
            ("constraints", "constraints", body.constraints, "[]"),
        ):
            if values is None:
                continue
            if len(values) != count:
                raise ApiError(
                    422,
                    f"{field} has {len(values)} items but text has {count}; send one per text "
                    f"item ({empty} where an item has none)",
                )
            if _given(values):
                columns[name] = values
        self._check_constraints(body.constraints or [], search, "constraints" in columns)
        if columns:  # too many target tokens for an output, before any work is queued
            try:
                self.model.translator.steering(
                    count, columns.get("prefixes"), columns.get("constraints")
                )
            except ValueError as err:
                raise ApiError(422, str(err)) from None
        return columns

    def _check_constraints(self, constraints: list[list[str]], search: Any, used: bool) -> None:
        """No empty phrase; and, when ``used`` (a line has a phrase), a search that can meet
        constraints: beam search, on the torch engine."""
        for i, phrases in enumerate(constraints):
            for j, phrase in enumerate(phrases):
                if not phrase.strip():
                    raise ApiError(
                        422,
                        f"constraints.{i}.{j} is an empty phrase; give the words an output must "
                        'contain, e.g. [["Katzen", "im Garten"]]',
                    )
        if not used:
            return
        if search.sampling:
            raise ApiError(
                422,
                "constraints need beam search, but the request samples; leave out sampling_topk "
                "and sampling_topp, or the constraints",
            )
        if self.model.engine_kind == "ctranslate2":
            try:
                check_ct2_search(search, constrained=True)
            except SettingError as err:
                raise ApiError(422, err.render(spell)) from None

    def check_size(self, texts: list[str], steering: Iterable[str] = ()) -> None:
        """At least one sentence, and no more sentences and characters (``steering``: the
        prefixes and constraint phrases, counted too) than the limits allow."""
        limits = self.limits
        if not texts:
            raise ApiError(
                422, 'text is an empty list; send at least one sentence: {"text": ["..."]}'
            )
        if len(texts) > limits.max_sentences:
            raise ApiError(
                413,
                f"{len(texts)} sentences in one request, the service takes at most "
                f"{limits.max_sentences}; split the request",
            )
        chars = sum(len(t) for t in texts) + sum(len(s) for s in steering)
        if chars > limits.max_chars:
            raise ApiError(
                413,
                f"{chars} characters in one request (prefixes and constraints included), the "
                f"service takes at most {limits.max_chars}; split the request",
            )

    def translate(
        self, body: TranslateRequest, watch: Stopwatch | None = None
    ) -> Awaitable[list[Translation]]:
        """The job of ``body`` in the batcher's queue, to await; every check is made first."""
        search = self.search(body)
        phrases = [p for line in body.constraints or () for p in line]
        self.check_size(body.text, [*(body.prefix or ()), *phrases])
        columns = self.steering(body, search)
        options = CallOptions(search, body.alignments, self.target(body))
        tokens = self.model.source_tokens(body.text)
        if watch is not None:
            watch.mark("check")
        return self.batcher.submit(body.text, options, tokens, columns=columns, watch=watch)

    def attention(self, body: AttentionRequest) -> Awaitable[dict[str, Any]]:
        """The /attention answer, to await: the model's translation (unless the body gives
        one), then one attention pass, each a job in the batcher's queue."""
        search = self.search(body)
        self.check_size([body.text, body.translation or ""])
        return self._attend(body, search)

    async def _attend(self, body: AttentionRequest, search: SearchConfig) -> dict[str, Any]:
        text, tokens = body.text, self.model.source_tokens([body.text])
        output = body.translation
        lang = self.target(body)
        if output is None:
            options = CallOptions(search, tgt_lang=lang)
            (result,) = await self.batcher.submit([text], options, tokens)
            output = result.text
        values, most = self.model.attention_values(text, output), self.limits.max_attention_values
        if values > most:
            raise ApiError(
                413,
                f"the attention maps of this sentence and output hold {values} weights, the "
                f"service returns at most {most}; send a shorter sentence or output",
            )

        def attend(lines: list[str], options: Any, *, stop: Any) -> list[dict[str, Any]]:
            # One forward pass with hooks: too short to need ``stop``, and run alone.
            return [self.model.attention(text, output, tgt_lang=lang)]

        (maps,) = await self.batcher.submit([text], "attention", tokens, run=attend)
        return {"translation": output, **maps}
