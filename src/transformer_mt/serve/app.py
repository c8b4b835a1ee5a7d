"""The HTTP service (FastAPI): translate, attention, model facts, health, and the page at ``/``.

Every error is a 4xx/5xx answer with one line of JSON, ``{"error": "<cause>; <fix>"}``, and the
service goes on serving. Requests carry text only: no field names a path, so a client cannot
make the server read or write a file.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable
from pathlib import Path
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse
from fastapi.staticfiles import StaticFiles
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException

from transformer_mt.inference.search import SearchConfig
from transformer_mt.serve.batcher import Batcher, QueueFull
from transformer_mt.serve.limits import Limits
from transformer_mt.serve.model import ServedModel

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


class TranslateRequest(DecodingFields):
    text: list[str] = Field(description="the sentences to translate, one per item")
    nbest: int | None = Field(
        None, description="also return the n best hypotheses of each sentence (<= beam_size)"
    )


class AttentionRequest(DecodingFields):
    text: str = Field(description="one source sentence")
    translation: str | None = Field(
        None, description="the output to attend over (default: the model's translation)"
    )


def error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": " ".join(message.split())}, status_code=status)


class BodyLimit:
    """ASGI middleware: a declared body over ``max_bytes`` is refused before it is read."""

    def __init__(self, app: Any, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            length = dict(scope["headers"]).get(b"content-length", b"")
            if length.isdigit() and int(length) > self.max_bytes:
                message = (
                    f"the request body has {int(length)} bytes, the service reads at most "
                    f"{self.max_bytes}; split the request"
                )
                await error(413, message)(scope, receive, send)
                return
        await self.app(scope, receive, send)


def _validation_message(exc: RequestValidationError) -> tuple[int, str]:
    """The first problem of a request body as one line, and its status."""
    problems = exc.errors()
    first = problems[0] if problems else {}
    kind, where = first.get("type", ""), [str(p) for p in first.get("loc", ()) if p != "body"]
    if kind == "json_invalid":
        return (
            400,
            'the request body is not valid JSON; send a JSON object such as {"text": ["..."]}',
        )
    if kind == "extra_forbidden":
        known = ", ".join(TranslateRequest.model_fields)
        return 422, f"unknown option {'.'.join(where)!r}; the options are {known}"
    if kind == "missing" and where:
        return 422, f'{".".join(where)} is missing; send a JSON object such as {{"text": ["..."]}}'
    place = ".".join(where) or "body"
    return 422, f"{place}: {first.get('msg', 'invalid value')}; see /docs for the request schema"


class Service:
    """The routes' shared state: the served model, its limits and the batcher."""

    def __init__(self, model: ServedModel, limits: Limits) -> None:
        self.model, self.limits = model, limits
        self.batcher = Batcher(
            model.translate,
            max_tokens=limits.batch_tokens,
            window_s=limits.window_ms / 1000,
            max_pending=limits.max_pending,
        )

    def search(self, request: DecodingFields) -> SearchConfig:
        beam, alpha = request.beam_size, request.length_penalty
        nbest = getattr(request, "nbest", None)
        if beam is not None and not 1 <= beam <= self.limits.max_beam:
            raise ApiError(422, f"beam_size must be 1..{self.limits.max_beam}, got {beam}")
        if alpha is not None and not 0.0 <= alpha <= 10.0:
            raise ApiError(422, f"length_penalty must be between 0 and 10, got {alpha}")
        if nbest is not None:
            width = beam if beam is not None else self.model.defaults.beam_size
            if not 1 <= nbest <= width:
                raise ApiError(
                    422, f"nbest must be 1..beam_size ({width}), got {nbest}; ask for a wider beam"
                )
        return self.model.search(beam_size=beam, length_penalty=alpha, nbest=nbest)

    def check_size(self, texts: list[str]) -> None:
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
        chars = sum(len(t) for t in texts)
        if chars > limits.max_chars:
            raise ApiError(
                413,
                f"{chars} characters in one request, the service takes at most "
                f"{limits.max_chars}; split the request",
            )

    async def translate(
        self, request: Request, texts: list[str], search: SearchConfig
    ) -> list[Any]:
        """Queue ``texts`` with the batcher; give up when the client leaves or time runs out."""
        tokens = self.model.source_tokens(texts)
        try:
            job = self.batcher.submit(texts, search, tokens)
            return await _until_gone(request, job, self.limits.timeout_s)
        except QueueFull as err:
            raise ApiError(503, str(err)) from None
        except (ApiError, asyncio.CancelledError):
            raise
        except Exception as err:  # the engine failed on this batch; the service goes on
            raise ApiError(500, f"translation failed ({type(err).__name__}: {err})") from err


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


def create_app(model: ServedModel, limits: Limits | None = None) -> FastAPI:
    """The FastAPI application serving ``model``."""
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
    _add_error_handlers(app)
    _add_routes(app, service)
    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    return app


def _add_error_handlers(app: FastAPI) -> None:
    async def on_api_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, ApiError)
        return error(exc.status, str(exc))

    async def on_invalid(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        return error(*_validation_message(exc))

    async def on_http(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, HTTPException)
        return error(exc.status_code, str(exc.detail))

    async def on_bug(request: Request, exc: Exception) -> JSONResponse:
        log.exception("request %s failed", request.url.path)
        return error(500, f"internal error ({type(exc).__name__}: {exc}); see the server log")

    app.add_exception_handler(ApiError, on_api_error)
    app.add_exception_handler(RequestValidationError, on_invalid)
    app.add_exception_handler(HTTPException, on_http)
    app.add_exception_handler(Exception, on_bug)


def _add_routes(app: FastAPI, service: Service) -> None:
    model = service.model
    info = model.info()
    brief = {k: info[k] for k in ("checkpoint", "src_lang", "tgt_lang", "engine")}

    @app.post("/translate")
    async def translate(body: TranslateRequest, request: Request) -> dict[str, Any]:
        """Translate ``text`` (a list of sentences): one translation per sentence, in order."""
        search = service.search(body)
        service.check_size(body.text)
        results = await service.translate(request, body.text, search)
        answer: dict[str, Any] = {
            "translations": [t.text for t in results],
            "scores": [t.score for t in results],
        }
        if body.nbest is not None:
            answer["nbest"] = [
                [{"text": h.text, "score": h.score} for h in t.hypotheses] for t in results
            ]
        return {**answer, "model": brief}

    @app.post("/attention")
    async def attention(body: AttentionRequest, request: Request) -> dict[str, Any]:
        """Every attention weight (layer x head) of a teacher-forced pass over one sentence."""
        search = service.search(body)
        service.check_size([body.text, body.translation or ""])
        translation = body.translation
        if translation is None:
            (result,) = await service.translate(request, [body.text], search)
            translation = result.text
        maps = await service.batcher.call(model.attention, body.text, translation)
        return {"translation": translation, **maps}

    @app.get("/model")
    async def model_info() -> dict[str, Any]:
        """Languages, parameters, decoding defaults and the BLEU stored in the checkpoint."""
        return {**info, "limits": vars(service.limits)}

    @app.get("/health")
    async def health() -> dict[str, Any]:
        """``ok`` while the service answers; the sentences waiting and batches run so far."""
        batcher = service.batcher
        return {"status": "ok", "pending": batcher.pending, "batches": batcher.batches}

    @app.get("/", include_in_schema=False)
    async def page() -> FileResponse:
        return FileResponse(STATIC / "index.html")
