"""ASGI middleware that answers before the application reads a body: the body limit and the
API key. Every answer is one line of JSON, ``{"error": "<cause>; <fix>"}``."""

from __future__ import annotations

import asyncio
import contextlib
import hmac
from typing import Any

from fastapi.responses import JSONResponse


def error(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": " ".join(message.split())}, status_code=status, headers=headers)


#: After an early answer, what the client still sends is dropped up to this many bytes or
#: seconds before the close, as nginx's "lingering close": unread bytes would reset the socket.
LINGER_BYTES, LINGER_S = 8 << 20, 2.0


async def refuse(
    status: int, message: str, receive: Any, send: Any, *, drain: bool = True, headers: Any = ()
) -> None:
    """Answer ``status`` (with ``headers``) before the body is read, drop what the client still
    sends (``drain``: more may come), then close the connection."""
    answer = error(status, message, {**dict(headers), "connection": "close"})
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
    """A body over ``max_bytes`` is answered 413 and never read to its end: a declared
    ``Content-Length`` before anything is read, any other body the moment the bytes counted
    pass the limit (the application is then told the client has gone)."""

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


class KeyCheck:
    """Every request but a GET of :data:`OPEN_PATHS` (and ``/static/``) needs
    ``Authorization: Bearer KEY``, compared in constant time; else 401, before any body is
    read. Paths under ``body_keyed`` pass: their routes check the key the request carries."""

    def __init__(self, app: Any, key: str, *, body_keyed: str | None = None) -> None:
        self.app, self.key, self.body_keyed = app, key.encode(), body_keyed

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        path = scope.get("path", "")
        static = path.startswith("/static/") and ".." not in path
        is_open = scope.get("method") in ("GET", "HEAD") and (path in OPEN_PATHS or static)
        is_open |= bool(self.body_keyed) and path.startswith(f"{self.body_keyed}/")
        if scope["type"] == "http" and not is_open:
            given = dict(scope["headers"]).get(b"authorization", b"")
            scheme, _, token = given.partition(b" ")
            if scheme.lower() != b"bearer" or not hmac.compare_digest(token.strip(), self.key):
                cause = "the API key is wrong" if given else "this service needs an API key"
                fix = 'send the header "Authorization: Bearer KEY" (the page: open /#key=KEY)'
                headers = {"www-authenticate": "Bearer"}
                await refuse(401, f"{cause}; {fix}", receive, send, headers=headers)
                return
        await self.app(scope, receive, send)
