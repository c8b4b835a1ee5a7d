"""The HTTP service (FastAPI): translate, attention, model facts, health, and the page at ``/``.

Every error is a 4xx/5xx answer with one line of JSON, ``{"error": "<cause>; <fix>"}``, and the
service goes on serving; an unexpected failure tells the client an incident id, and the server
log its details. Requests carry text only: no field names a path, so a client cannot make the
server read or write a file. Nothing one client sends holds the service: a body is counted as
it streams in, every piece of work waits in one bounded queue under one time-out, and work
nobody waits for any more stops (:mod:`~transformer_mt.serve.batcher`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hmac
import json
import logging
import secrets
from collections.abc import AsyncIterator, Awaitable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse
from fastapi.security import HTTPBearer
from fastapi.staticfiles import StaticFiles
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException

from transformer_mt.errors import SettingError
from transformer_mt.inference.alignment import pharaoh
from transformer_mt.inference.ctranslate2_engine import check_ct2_search
from transformer_mt.inference.search import SearchConfig
from transformer_mt.inference.translator import Candidate, Translation
from transformer_mt.serve.batcher import Batcher, QueueFull
from transformer_mt.serve.limits import Limits
from transformer_mt.serve.model import ServedModel
from transformer_mt.serve.timing import ServerTiming, Stopwatch

log = logging.getLogger(__name__)

STATIC = Path(__file__).parent / "static"

T = TypeVar("T")


class ApiError(Exception):
    """An answer other than 200: the status and the one-line message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class DecodingFields(BaseModel):
    """Decoding options a request may set; absent = the checkpoint's stored default."""

    model_config = ConfigDict(extra="forbid", strict=True)

    beam_size: int | None = Field(None, description="beam size (1 = greedy)")
    length_penalty: float | None = Field(
        None, description="alpha of the checkpoint's length normalisation, gnmt or power (>= 0)"
    )
    sampling_topk: int | None = Field(
        None,
        description="sample each token from the K most likely (0 = the whole vocabulary) "
        "instead of searching; beam_size must be 1",
    )
    sampling_topp: float | None = Field(
        None, description="sample from the most likely tokens whose probability reaches P, (0, 1]"
    )
    temperature: float | None = Field(
        None, description="sampling temperature (> 0; > 1 flattens the distribution)"
    )
    seed: int | None = Field(
        None, description="sampling seed: the same seed and sentence give the same samples"
    )
    tgt_lang: str | None = Field(
        None,
        description="the language to translate into, for a multilingual model (default: the "
        "service's --tgt-lang); GET /model lists target_languages",
    )


class TranslateRequest(DecodingFields):
    text: list[str] = Field(description="the sentences to translate, one per item")
    nbest: int | None = Field(
        None,
        description="also return the n best hypotheses of each sentence (<= beam_size; with "
        "sampling, the samples drawn per sentence)",
    )
    prefix: list[str] | None = Field(
        None,
        description='one target prefix per text item ("" for none): each output starts with it',
    )
    constraints: list[list[str]] | None = Field(
        None,
        description="target phrases per text item ([] for none) that each output contains "
        "(beam search, torch engine)",
    )
    alignments: bool = Field(
        False, description="add each output's word alignment to its source (Pharaoh i-j pairs)"
    )


class AttentionRequest(DecodingFields):
    text: str = Field(description="one source sentence")
    translation: str | None = Field(
        None, description="the output to attend over (default: the model's translation)"
    )


def error(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": " ".join(message.split())}, status_code=status, headers=headers)


#: After an answer given before the body is read (a body over the limit, a missing key), what
#: the client still sends is read and dropped, up to this many bytes or seconds, and then the
#: connection closes: closing a socket with unread bytes in it resets the connection, and a
#: client still sending would lose the answer (the "lingering close" of nginx and Apache).
LINGER_BYTES, LINGER_S = 8 << 20, 2.0


async def refuse(
    status: int,
    message: str,
    receive: Any,
    send: Any,
    headers: dict[str, str] | None = None,
    *,
    drain: bool = True,
) -> None:
    """Answer ``status`` before the body is read, drop what the client still sends (``drain``:
    more may come; within :data:`LINGER_BYTES` and :data:`LINGER_S`, never the rest of an
    endless body), then close the connection."""
    answer = error(status, message, {**(headers or {}), "connection": "close"})
    await send({"type": "http.response.start", "status": status, "headers": answer.raw_headers})
    await send({"type": "http.response.body", "body": answer.body, "more_body": True})
    if drain:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(_drain(receive), LINGER_S)
    await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _drain(receive: Any) -> None:
    dropped = 0
    while dropped <= LINGER_BYTES:
        message = await receive()
        if message["type"] != "http.request" or not message.get("more_body", False):
            return
        dropped += len(message.get("body", b""))


class BodyLimit:
    """ASGI middleware: a body over ``max_bytes`` is answered 413 and never read to its end.

    A declared ``Content-Length`` over the limit is refused before anything is read; any other
    body (chunked, or sent past what it declared) is counted as it streams in, and answered the
    moment the count passes the limit: the application is then told the client has gone, and
    whatever it answers is dropped. At most the limit and one chunk are ever held in memory
    (what :func:`refuse` drops after the answer is never kept).
    """

    def __init__(self, app: Any, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = dict(scope["headers"]).get(b"content-length", b"")
        if length.isdigit() and int(length) > self.max_bytes:
            await refuse(413, self.message(f"{int(length)} bytes"), receive, send)
            return
        body = _CountedBody(self, receive, send)
        await self.app(scope, body.receive, body.send)

    def message(self, size: str) -> str:
        return f"the request body has {size}, the service reads at most {self.max_bytes}; split it"


class _CountedBody:
    """One request's ``receive`` and ``send`` as :class:`BodyLimit` wraps them."""

    def __init__(self, limit: BodyLimit, receive: Any, send: Any) -> None:
        self.limit, self._receive, self._send = limit, receive, send
        self.read = 0  # body bytes received so far
        self.started = False  # the application's answer has begun
        self.refused = False  # answered 413: the application is told the client left

    async def receive(self) -> Any:
        if self.refused:
            return {"type": "http.disconnect"}
        message = await self._receive()
        if message["type"] == "http.request":
            self.read += len(message.get("body", b""))
            if self.read > self.limit.max_bytes:
                self.refused = True
                if not self.started:
                    size = f"more than {self.limit.max_bytes} bytes"
                    more = message.get("more_body", False)
                    await refuse(
                        413, self.limit.message(size), self._receive, self._send, drain=more
                    )
                return {"type": "http.disconnect"}
        return message

    async def send(self, message: Any) -> None:
        if self.refused:
            return  # the 413 was the answer
        self.started = self.started or message["type"] == "http.response.start"
        await self._send(message)


#: What a client may GET without the API key: the page and its files, the API's description
#: and the health check; none of them runs the model or says what it is.
OPEN_PATHS = frozenset({"/", "/health", "/docs", "/docs/oauth2-redirect", "/openapi.json"})


def _open(scope: Any) -> bool:
    path = scope["path"]
    static = path.startswith("/static/") and ".." not in path
    return scope["method"] in ("GET", "HEAD") and (path in OPEN_PATHS or static)


class KeyCheck:
    """ASGI middleware: every request but a GET of :data:`OPEN_PATHS` (and ``/static/``) needs
    ``Authorization: Bearer KEY``, compared in constant time; else 401, before any body is
    read."""

    def __init__(self, app: Any, key: str) -> None:
        self.app, self.key = app, key.encode()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and not _open(scope):
            given = dict(scope["headers"]).get(b"authorization", b"")
            scheme, _, token = given.partition(b" ")
            if scheme.lower() != b"bearer" or not hmac.compare_digest(token.strip(), self.key):
                cause = "the API key is wrong" if given else "this service needs an API key"
                fix = 'send the header "Authorization: Bearer KEY" (the page: open /#key=KEY)'
                headers = {"www-authenticate": "Bearer"}
                await refuse(401, f"{cause}; {fix}", receive, send, headers)
                return
        await self.app(scope, receive, send)


def _validation_message(exc: RequestValidationError, known: Iterable[str]) -> tuple[int, str]:
    """The first problem of a request body as one line, and its status (``known``: the
    route's options)."""
    problems = exc.errors()
    first = problems[0] if problems else {}
    kind, where = first.get("type", ""), [str(p) for p in first.get("loc", ()) if p != "body"]
    if kind == "json_invalid":
        return (
            400,
            'the request body is not valid JSON; send a JSON object such as {"text": ["..."]}',
        )
    if kind == "extra_forbidden":
        return 422, f"unknown option {'.'.join(where)!r}; the options are {', '.join(known)}"
    if kind == "missing" and where:
        return 422, f'{".".join(where)} is missing; send a JSON object such as {{"text": ["..."]}}'
    place = ".".join(where) or "body"
    return 422, f"{place}: {first.get('msg', 'invalid value')}; see /docs for the request schema"


#: The request fields that set sampling, passed to :meth:`ServedModel.search` as they are.
SAMPLING_FIELDS = ("sampling_topk", "sampling_topp", "temperature", "seed")


def _spell(setting: str, value: Any) -> str:
    """A fix as this service's user writes it: a request field as JSON, anything else as the
    flag of ``transformer-mt-serve`` (``--engine torch``)."""
    if setting in TranslateRequest.model_fields:
        return f'"{setting}": {json.dumps(value)}'
    return f"transformer-mt-serve --{setting.replace('_', '-')} {value}"


def _given(values: list[Any]) -> bool:
    """A prefix or constraint list that asks for something (not only empty entries)."""
    return any(v.strip() if isinstance(v, str) else v for v in values)


@dataclass(frozen=True)
class CallOptions:
    """What one engine call decodes with: the search, and whether word alignments come back.
    Hashable: the batcher gives jobs with equal options (and steering columns) one call."""

    search: SearchConfig
    alignments: bool = False
    tgt_lang: str | None = None


class Service:
    """The routes' shared state: the served model, its limits and the batcher."""

    def __init__(self, model: ServedModel, limits: Limits) -> None:
        self.model, self.limits = model, limits
        self.batcher = Batcher(
            self._run,
            max_tokens=limits.batch_tokens,
            window_s=limits.window_ms / 1000,
            max_pending=limits.max_pending,
            lanes=model.lanes,
        )

    def _run(
        self, lines: list[str], options: CallOptions, *, stop: Any, **columns: Any
    ) -> list[Translation]:
        """The batcher's engine call, on its worker thread; ``columns``: the lines' prefixes
        and constraints (:meth:`steering`); ``stop``: set when nobody waits for the outputs,
        which stops the search at its next step."""
        return self.model.translate(
            lines, options.search, alignments=options.alignments, should_stop=stop.is_set,
            tgt_lang=options.tgt_lang, **columns,
        )  # fmt: skip

    def target(self, request: DecodingFields) -> str | None:
        """The request's target language, checked against the model's: a 422 naming them."""
        lang = request.tgt_lang
        if lang is None and not self.model.needs_tgt_lang:
            return None
        loaded = self.model.loaded
        known = loaded.tokenizer.target_languages or [loaded.tgt_lang]
        if lang is None:
            if self.model.needs_tgt_lang:
                raise ApiError(
                    422,
                    f"this model translates into {', '.join(known)}: set tgt_lang in the "
                    "request (or start the service with --tgt-lang)",
                )
            return None
        if lang not in known:
            raise ApiError(
                422,
                f"tgt_lang {lang!r} is not a language this model translates into; it "
                f"translates into {', '.join(str(k) for k in known)}",
            )
        return lang

    def search(self, request: DecodingFields) -> SearchConfig:
        """The request's search over the checkpoint's stored one, as ``transformer-mt-translate``
        builds it from the same flags; beyond the limits, or a combination that cannot work
        (sampling with a beam, a seed on the ctranslate2 engine), is a 422 naming the fix."""
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
            search = self.model.search(beam_size=beam, length_penalty=alpha, nbest=nbest, **sample)
            if self.model.engine_kind == "ctranslate2":
                check_ct2_search(search)
        except SettingError as err:
            raise ApiError(422, err.render(_spell)) from None
        except ValueError as err:
            raise ApiError(422, str(err)) from None
        return search

    def _check_nbest(self, nbest: int, beam: int | None, *, sampling: bool) -> None:
        """``nbest`` within the beam; with sampling, the samples drawn per sentence, at most
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
        before any work is queued. A list of empty entries only is left out: the request then
        decodes (and batches) as one without it."""
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
        constrained = "constraints" in columns
        self._check_constraints(body.constraints or [], search, constrained=constrained)
        if not columns:
            return columns
        try:
            self.model.check_steering(count, columns.get("prefixes"), columns.get("constraints"))
        except ValueError as err:
            raise ApiError(422, " ".join(str(err).split())) from None
        return columns

    def _check_constraints(
        self, constraints: list[list[str]], search: SearchConfig, *, constrained: bool
    ) -> None:
        """No empty phrase; and, when the request is ``constrained`` (a phrase on some line),
        a search that can meet constraints: beam search, on the torch engine."""
        for i, phrases in enumerate(constraints):
            for j, phrase in enumerate(phrases):
                if not phrase.strip():
                    raise ApiError(
                        422,
                        f"constraints.{i}.{j} is an empty phrase; give the words an output must "
                        'contain, e.g. [["Katzen", "im Garten"]]',
                    )
        if not constrained:
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
                raise ApiError(422, err.render(_spell)) from None

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

    async def translate(
        self,
        request: Request,
        texts: list[str],
        search: SearchConfig,
        *,
        alignments: bool = False,
        columns: dict[str, list[Any]] | None = None,
        tgt_lang: str | None = None,
    ) -> list[Translation]:
        """Queue ``texts`` (and their ``columns``, :meth:`steering`) with the batcher; give up
        when the client leaves or time runs out."""
        tokens = self.model.source_tokens(texts)
        options = CallOptions(search, alignments, tgt_lang)
        watch = stopwatch(request)
        if watch is not None:
            watch.mark("check")
        job = self.batcher.submit(texts, options, tokens, columns=columns, watch=watch)
        results = await self.guarded(request, job)
        if watch is not None:
            watch.mark("resume")
        return results

    async def attention(
        self, request: Request, body: AttentionRequest, search: SearchConfig
    ) -> dict[str, Any]:
        """The /attention answer: the model's translation (unless the body gives one), then
        one attention pass, each a job in the batcher's queue, under one time-out."""
        return await self.guarded(request, self._attend(body, search))

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
        run = functools.partial(self._attention_pass, text, output, lang)
        (maps,) = await self.batcher.submit([text], "attention", tokens, run=run)
        return {"translation": output, **maps}

    def _attention_pass(
        self,
        source: str,
        output: str,
        tgt_lang: str | None,
        lines: list[str],
        options: Any,
        *,
        stop: Any,
    ) -> list[dict[str, Any]]:
        """An attention job's own engine call, on the worker thread: one forward pass, too
        short to need ``stop``."""
        return [self.model.attention(source, output, tgt_lang=tgt_lang)]

    async def guarded(self, request: Request, work: Awaitable[T]) -> T:
        """``work``'s result, or the answer that says why not: 503 when the queue is full, 504
        past the time-out, 499 when the client left (both give the work up), 500 with an
        incident id when the engine failed (the details go to the log, not to the client)."""
        try:
            return await _until_gone(request, work, self.limits.timeout_s)
        except QueueFull as err:
            raise ApiError(503, str(err)) from None
        except (ApiError, asyncio.CancelledError):
            raise
        except Exception as err:  # the engine failed on this batch; the service goes on
            raise ApiError(500, incident(request, err, "the engine")) from None


def stopwatch(request: Request) -> Stopwatch | None:
    """The request's :class:`~transformer_mt.serve.timing.Stopwatch` (None outside
    :class:`~transformer_mt.serve.timing.ServerTiming`)."""
    return request.scope.get("state", {}).get("timing")


def incident(request: Request, exc: BaseException, what: str) -> str:
    """Log ``exc`` with its traceback under a fresh incident id; the 500's message, which
    gives the client the id and none of the internals."""
    number = secrets.token_hex(4)
    log.error("incident %s: %s failed", number, request.url.path, exc_info=exc)
    return (
        f"{what} failed on this request (incident {number}); retry, and if it fails again "
        "report the incident id: the server log has the details"
    )


async def _until_gone(request: Request, work: Awaitable[T], timeout: float) -> T:
    """Await ``work``, cancelling it when the client disconnects or ``timeout`` passes."""
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        done, _ = await asyncio.wait(
            {task, gone}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
        )
    finally:
        gone.cancel()
    if task in done:
        return task.result()
    task.cancel()
    if gone in done:
        raise ApiError(499, "the client closed the connection")
    raise ApiError(
        504, f"no answer within {timeout:g} s; retry, or send fewer or shorter sentences"
    )


async def _disconnected(request: Request) -> None:
    """Return when the client closes the connection (the body has been read already)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


def create_app(
    model: ServedModel, limits: Limits | None = None, *, api_key: str | None = None
) -> FastAPI:
    """The FastAPI application serving ``model``; with ``api_key``, every route but the page,
    its files, the docs and /health needs it (:class:`KeyCheck`)."""
    service = Service(model, limits or Limits())

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        service.batcher.start()
        yield
        await service.batcher.stop()

    app = FastAPI(
        title="transformer-mt",
        summary="Translate with a transformer-mt checkpoint; see every attention head at /.",
        lifespan=lifespan,
    )
    app.state.service = service
    # JSON may spell a character as a 12-byte surrogate pair; the rest is the envelope.
    app.add_middleware(BodyLimit, max_bytes=12 * service.limits.max_chars + 65536)
    if api_key:
        app.add_middleware(KeyCheck, key=api_key)  # before any body is read
    app.add_middleware(ServerTiming)  # outermost: its clock starts with the headers read
    _add_error_handlers(app)
    _add_routes(app, service, secured=bool(api_key))
    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    return app


def _add_error_handlers(app: FastAPI) -> None:
    async def on_api_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, ApiError)
        return error(exc.status, str(exc))

    async def on_invalid(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        schema = AttentionRequest if request.url.path == "/attention" else TranslateRequest
        return error(*_validation_message(exc, schema.model_fields))

    async def on_http(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, HTTPException)
        return error(exc.status_code, str(exc.detail))

    async def on_bug(request: Request, exc: Exception) -> JSONResponse:
        return error(500, incident(request, exc, "the service"))

    app.add_exception_handler(ApiError, on_api_error)
    app.add_exception_handler(RequestValidationError, on_invalid)
    app.add_exception_handler(HTTPException, on_http)
    app.add_exception_handler(Exception, on_bug)


def _hypothesis(candidate: Candidate, alignments: bool) -> dict[str, Any]:
    """One entry of an n-best list, with its alignment when the request asks for them."""
    found = {"text": candidate.text, "score": candidate.score}
    return found | ({"alignment": pharaoh(candidate.alignment or [])} if alignments else {})


def _answer(results: list[Translation], body: TranslateRequest) -> dict[str, Any]:
    """The /translate answer: the texts and scores, with the alignments (Pharaoh strings) and
    the n-best lists when asked."""
    answer: dict[str, Any] = {
        "translations": [t.text for t in results],
        "scores": [t.score for t in results],
    }
    if body.alignments:
        answer["alignments"] = [pharaoh(t.hypotheses[0].alignment or []) for t in results]
    if body.nbest is not None:
        answer["nbest"] = [[_hypothesis(h, body.alignments) for h in t.hypotheses] for t in results]
    return answer


def _add_routes(app: FastAPI, service: Service, *, secured: bool = False) -> None:
    """The routes; ``secured``: the OpenAPI schema says they need the bearer key (so /docs
    offers to send it; :class:`KeyCheck` checks it)."""
    model = service.model
    info = model.info()
    brief = {k: info[k] for k in ("checkpoint", "src_lang", "tgt_lang", "engine")}
    key = [Depends(HTTPBearer(auto_error=False, description="the service's API key"))]
    deps = key if secured else []

    @app.post("/translate", dependencies=deps)
    async def translate(body: TranslateRequest, request: Request) -> dict[str, Any]:
        """Translate ``text`` (a list of sentences): one translation per sentence, in order."""
        watch = stopwatch(request)
        if watch is not None:
            watch.mark("read")
        search = service.search(body)
        phrases = [p for line in body.constraints or () for p in line]
        service.check_size(body.text, [*(body.prefix or ()), *phrases])
        columns = service.steering(body, search)
        lang = service.target(body)
        results = await service.translate(
            request, body.text, search, alignments=body.alignments, columns=columns, tgt_lang=lang
        )
        return {**_answer(results, body), "model": brief}

    @app.post("/attention", dependencies=deps)
    async def attention(body: AttentionRequest, request: Request) -> dict[str, Any]:
        """Every attention weight (layer x head) of a teacher-forced pass over one sentence."""
        search = service.search(body)
        service.check_size([body.text, body.translation or ""])
        return await service.attention(request, body, search)

    @app.get("/model", dependencies=deps)
    async def model_info() -> dict[str, Any]:
        """Languages, parameters, decoding defaults and the BLEU stored in the checkpoint."""
        return {**info, "limits": vars(service.limits)}

    @app.get("/health")
    async def health() -> dict[str, Any]:
        """``ok`` while the service answers; the sentences waiting, the engine calls run so
        far and those stopped early because nobody waited for them any more."""
        batcher = service.batcher
        return {
            "status": "ok", "pending": batcher.pending, "batches": batcher.batches,
            "stopped": batcher.stopped,
        }  # fmt: skip

    @app.get("/", include_in_schema=False)
    async def page() -> FileResponse:
        return FileResponse(STATIC / "index.html")
