"""The HTTP service (FastAPI): translate, attention, model facts, health, and the page at ``/``.

Every error is one line of JSON, ``{"error": "<cause>; <fix>"}``, and the service goes on; an
unexpected failure tells the client an incident id, and the server log its details.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import AsyncIterator, Awaitable
from pathlib import Path
from typing import Any, TypeVar

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse
from fastapi.security import HTTPBearer
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException

from transformer_mt.inference.alignment import pharaoh
from transformer_mt.inference.translator import Translation
from transformer_mt.serve.batcher import QueueFull
from transformer_mt.serve.libretranslate import PREFIX, add_libretranslate
from transformer_mt.serve.limits import Limits
from transformer_mt.serve.middleware import BodyLimit, KeyCheck, error
from transformer_mt.serve.model import ServedModel
from transformer_mt.serve.schemas import (
    AttentionRequest,
    TranslateRequest,
    errors,
    validation_message,
)
from transformer_mt.serve.service import ApiError, Service
from transformer_mt.serve.timing import ServerTiming, Stopwatch

log = logging.getLogger(__name__)

STATIC = Path(__file__).parent / "static"

T = TypeVar("T")


def incident(request: Request, exc: BaseException, what: str) -> str:
    """Log ``exc`` with its traceback under a fresh incident id; the 500's message, which
    gives the client the id and none of the internals."""
    number = secrets.token_hex(4)
    log.error("incident %s: %s failed", number, request.url.path, exc_info=exc)
    return (
        f"{what} failed on this request (incident {number}); retry, and if it fails again "
        "report the incident id: the server log has the details"
    )


async def until_gone(request: Request, work: Awaitable[T], timeout: float) -> T:
    """``work``'s result, or the answer that says why not: 499 when the client leaves and 504
    past ``timeout`` (both cancel the work, which tells the batcher its caller has gone), 503
    when the queue is full, 500 with an incident id when the engine failed."""
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        done, _ = await asyncio.wait(
            {task, gone}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
        )
    finally:
        gone.cancel()
    if task not in done:
        task.cancel()
        if gone in done:
            raise ApiError(499, "the client closed the connection")
        raise ApiError(
            504, f"no answer within {timeout:g} s; retry, or send fewer or shorter sentences"
        )
    try:
        return task.result()
    except QueueFull as err:
        raise ApiError(503, str(err)) from None
    except (ApiError, asyncio.CancelledError):
        raise
    except Exception as err:  # the engine failed on this batch; the service goes on
        raise ApiError(500, incident(request, err, "the engine")) from None


async def _disconnected(request: Request) -> None:
    """Return when the client closes the connection (the body has been read already)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


def create_app(
    model: ServedModel, limits: Limits | None = None, *, api_key: str | None = None
) -> FastAPI:
    """The FastAPI application serving ``model``, its own routes and LibreTranslate's; with
    ``api_key``, every route but the page, its files, the docs and /health needs it
    (:class:`~.middleware.KeyCheck`; LibreTranslate's routes read it from the request)."""
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
        # Before any body is read; LibreTranslate's clients send the key in the body.
        app.add_middleware(KeyCheck, key=api_key, body_keyed=PREFIX)
    app.add_middleware(ServerTiming)  # outermost: its clock starts with the headers read
    _add_error_handlers(app)
    _add_routes(app, service, secured=bool(api_key))
    add_libretranslate(app, service, wait=until_gone, api_key=api_key)
    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    return app


def _add_error_handlers(app: FastAPI) -> None:
    async def on_api_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, ApiError)
        return error(exc.status, str(exc))

    async def on_invalid(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        schema = AttentionRequest if request.url.path == "/attention" else TranslateRequest
        return error(*validation_message(exc, schema.model_fields))

    async def on_http(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, HTTPException)  # its headers: a 405's Allow
        return error(exc.status_code, str(exc.detail), exc.headers)

    async def on_bug(request: Request, exc: Exception) -> JSONResponse:
        return error(500, incident(request, exc, "the service"))

    app.add_exception_handler(ApiError, on_api_error)
    app.add_exception_handler(RequestValidationError, on_invalid)
    app.add_exception_handler(HTTPException, on_http)
    app.add_exception_handler(Exception, on_bug)


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
        answer["nbest"] = [
            [
                {"text": h.text, "score": h.score}
                | ({"alignment": pharaoh(h.alignment or [])} if body.alignments else {})
                for h in t.hypotheses
            ]
            for t in results
        ]
    return answer


def _add_routes(app: FastAPI, service: Service, *, secured: bool = False) -> None:
    """The routes; ``secured``: the OpenAPI schema says they need the bearer key (so /docs
    offers to send it)."""
    info = service.model.info()
    brief = {k: info[k] for k in ("checkpoint", "src_lang", "tgt_lang", "engine")}
    key = [Depends(HTTPBearer(auto_error=False, description="the service's API key"))]
    deps = key if secured else []
    keyed = (401,) if secured else ()
    work = errors(400, *keyed, 413, 422, 500, 503, 504)  # a job in the batcher's queue

    @app.post("/translate", dependencies=deps, responses=work)
    async def translate(body: TranslateRequest, request: Request) -> dict[str, Any]:
        """Translate ``text`` (a list of sentences): one translation per sentence, in order."""
        watch: Stopwatch | None = request.scope.get("state", {}).get("timing")  # ServerTiming's
        if watch is not None:
            watch.mark("read")
        job = service.translate(body, watch)
        results = await until_gone(request, job, service.limits.timeout_s)
        if watch is not None:
            watch.mark("resume")
        return {**_answer(results, body), "model": brief}

    @app.post("/attention", dependencies=deps, responses=work)
    async def attention(body: AttentionRequest, request: Request) -> dict[str, Any]:
        """Every attention weight (layer x head) of a teacher-forced pass over one sentence."""
        return await until_gone(request, service.attention(body), service.limits.timeout_s)

    @app.get("/model", dependencies=deps, responses=errors(*keyed, 500))
    async def model_info() -> dict[str, Any]:
        """Languages, parameters, decoding defaults and the BLEU stored in the checkpoint."""
        return {**info, "limits": vars(service.limits)}

    @app.get("/health", responses=errors(500))
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
