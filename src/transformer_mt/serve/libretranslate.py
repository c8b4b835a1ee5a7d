"""LibreTranslate's API beside the service's own, under :data:`PREFIX`, so that its clients
(libretranslatepy, browser extensions, office plugins) translate with the served model.

A request becomes the service's :class:`~.schemas.TranslateRequest` and takes its path (checks,
limits, batching, time-out): only the shapes differ. A refusal is LibreTranslate's
``{"error": ...}`` with its status: 400 for a bad request (the service's 422 too), 403 for the
key, which its clients send as ``api_key`` in the body, so these routes check it themselves.
"""

from __future__ import annotations

import functools
import hmac
import html
import json
import re
from collections.abc import Awaitable, Callable
from typing import Any, Literal
from urllib.parse import parse_qsl

from fastapi import FastAPI, Request
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from transformer_mt.serve.model import ServedModel
from transformer_mt.serve.schemas import TranslateRequest, errors
from transformer_mt.serve.service import ApiError, Service

#: Where the routes live: a client's base URL is ``http://HOST:PORT/libretranslate/``.
PREFIX = "/libretranslate"

#: English names of the languages of the shipped data sets; any other shows its code.
NAMES = {"cs": "Czech", "de": "German", "en": "English", "fr": "French"}

#: What stays as it is around the texts translated: line breaks; in HTML, tags, comments,
#: and scripts and styles whole.
KEPT = {
    "text": re.compile(r"(\n+)"),
    "html": re.compile(
        r"(<script\b.*?</script\s*>|<style\b.*?</style\s*>|<!--.*?-->|<[^>]*>)", re.I | re.S
    ),
}

#: How a route awaits its work (app.py's ``until_gone``: the time-out, a client that leaves).
Wait = Callable[[Request, Awaitable[Any], float], Awaitable[Any]]

EXAMPLE = 'e.g. {"q": "Hello.", "source": "en", "target": "de"}'
#: The bodies LibreTranslate's clients send.
FORMS = ("application/json", "application/x-www-form-urlencoded")


class LibreRequest(BaseModel):
    """LibreTranslate's translate parameters (it ignores others, and so do these routes)."""

    model_config = ConfigDict(extra="ignore")

    q: str | list[str]
    source: str
    target: str
    format: Literal["text", "html"] = "text"
    alternatives: int = Field(0, ge=0)


def directions(model: ServedModel) -> dict[str, list[str]]:
    """Each source language the checkpoint was trained on, and its targets."""
    loaded, data = model.loaded, model.loaded.data_config()
    targets = loaded.tokenizer.target_languages or [loaded.tgt_lang]
    found: dict[str, list[str]] = {}
    for source, target in data.pairs if data else [(loaded.src_lang, t) for t in targets]:
        found.setdefault(str(source), []).append(str(target))
    return found


async def read_params(request: Request, key: str | None) -> dict[str, Any]:
    """The query's and the body's parameters (JSON, or a form as libretranslatepy sends), the
    service's key (if any) among them, compared in constant time."""
    params: dict[str, Any] = dict(request.query_params)
    body = (await request.body()).strip()
    kind = request.headers.get("content-type", "").partition(";")[0].strip().lower()
    if body and kind == "application/json":
        try:
            data = json.loads(body)
        except (ValueError, RecursionError):  # not JSON, or nested past Python's stack
            data = None
        if not isinstance(data, dict):
            raise ApiError(400, f"the request body is not a JSON object; send one, {EXAMPLE}")
        params.update(data)
    elif body and kind in ("", "application/x-www-form-urlencoded"):
        params.update(parse_qsl(body.decode("utf-8", "replace"), keep_blank_values=True))
    elif body:
        raise ApiError(400, f"a {kind} body is not read here; send JSON or a form, {EXAMPLE}")
    # LibreTranslate's clients send api_key; the service's own bearer header is taken too.
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    given = params.get("api_key") or (token if scheme.lower() == "bearer" else None)
    if key and not (isinstance(given, str) and hmac.compare_digest(given.encode(), key.encode())):
        cause = "the API key is wrong" if given else "this service needs an API key"
        raise ApiError(403, f"{cause}; send the service's key as api_key")
    return params


def parse(params: dict[str, Any], trained: dict[str, list[str]]) -> LibreRequest:
    """The request: known parameters of the right types, text, a trained pair."""
    try:
        body = LibreRequest.model_validate(params)
    except ValidationError as err:
        first = err.errors()[0]
        name = str(first["loc"][0]) if first["loc"] else "body"
        if first["type"] == "missing":
            raise ApiError(400, f"missing {name} parameter; {EXAMPLE}") from None
        raise ApiError(400, f"{name}: {first['msg']}; {EXAMPLE}") from None
    if not body.q:
        raise ApiError(400, f"q is empty; send the text to translate, {EXAMPLE}")
    sources = [s for s, ts in trained.items() if body.target in ts]
    if not sources or body.source not in [*sources, "auto"]:
        pairs = ", ".join(f"{s}-{t}" for s, ts in trained.items() for t in ts)
        raise ApiError(
            400,
            f"{body.source}-{body.target} is not a language pair this model was trained for; it "
            f"translates {pairs} (GET {PREFIX}/languages)",
        )
    return body


async def translate(
    service: Service, request: Request, body: LibreRequest, *, wait: Wait
) -> tuple[list[str], list[list[str]]]:
    """Each ``q`` item translated (cut at what :data:`KEPT` keeps, each text between translated
    and put back between its spaces), and the distinct alternatives of a one-line text."""
    markup = body.format == "html"
    items = [KEPT[body.format].split(q) for q in ([body.q] if isinstance(body.q, str) else body.q)]
    at = [(i, j) for i, p in enumerate(items) for j in range(0, len(p), 2) if p[j].strip()]
    nbest = body.alternatives + 1 if body.alternatives and not markup else None
    beam = None if nbest is None else max(service.model.defaults.beam_size, nbest)
    if beam is not None and beam > service.limits.max_beam:
        most = service.limits.max_beam - 1
        raise ApiError(400, f"alternatives must be 0..{most} here, got {beam - 1}; ask for fewer")
    texts = [html.unescape(items[i][j]) if markup else items[i][j] for i, j in at]
    try:
        ask = TranslateRequest(text=texts, tgt_lang=body.target, nbest=nbest, beam_size=beam)
        results = (
            await wait(request, service.translate(ask), service.limits.timeout_s) if at else []
        )
    except ValidationError as err:
        raise ApiError(400, f"q: {err.errors()[0]['msg'].removeprefix('Value error, ')}") from None
    except ApiError as err:
        raise ApiError(400 if err.status == 422 else err.status, str(err)) from None
    alternatives: list[list[str]] = [[] for _ in items]
    for (i, j), result in zip(at, results):
        old, new = items[i][j], html.escape(result.text, quote=False) if markup else result.text
        items[i][j] = old[: len(old) - len(old.lstrip())] + new + old[len(old.rstrip()) :]
        if nbest and len(items[i]) == 1:
            others = (h.text for h in result.hypotheses[1:] if h.text != result.text)
            alternatives[i] = list(dict.fromkeys(others))
    return ["".join(p) for p in items], alternatives


def add_libretranslate(app: FastAPI, service: Service, *, wait: Wait, api_key: str | None) -> None:
    """LibreTranslate's routes, under :data:`PREFIX`; with ``api_key``, each needs it."""

    @functools.cache
    def trained() -> dict[str, list[str]]:  # read at the first request
        return directions(service.model)

    schema = LibreRequest.model_json_schema()
    schema["properties"]["api_key"] = {"type": "string", "description": "the service's key"}
    body = {"required": True, "content": {k: {"schema": schema} for k in FORMS}}

    @app.post(
        f"{PREFIX}/translate",
        responses=errors(400, 403, 413, 500, 503, 504),
        openapi_extra={"requestBody": body},
    )
    async def libretranslate(request: Request) -> dict[str, Any]:
        """LibreTranslate's translate: ``q`` (a string or a list), ``source`` (``auto``: the
        model's), ``target``, ``format`` (text or html), ``alternatives``, ``api_key``."""
        body = parse(await read_params(request, api_key), trained())
        texts, alternatives = await translate(service, request, body, wait=wait)
        one = isinstance(body.q, str)
        answer: dict[str, Any] = {"translatedText": texts[0] if one else texts}
        if body.alternatives:
            answer["alternatives"] = alternatives[0] if one else alternatives
        sources = [s for s, ts in trained().items() if body.target in ts]
        if body.source == "auto" and len(sources) == 1:
            found = {"confidence": 100.0, "language": sources[0]}
            answer["detectedLanguage"] = found if one else [found] * len(texts)
        return answer

    @app.get(f"{PREFIX}/languages", responses=errors(403, 500))
    async def languages(request: Request) -> list[dict[str, Any]]:
        """LibreTranslate's languages: each source language of the model and its targets."""
        await read_params(request, api_key)
        return [{"code": s, "name": NAMES.get(s, s), "targets": ts} for s, ts in trained().items()]
