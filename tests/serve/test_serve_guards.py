"""What a careless or hostile client sends cannot hold the service: bodies are counted as they
stream in, /attention waits in the same bounded queue as /translate under the same time-out and
has a bounded answer, and with an API key set only its holders run the model.

Every outcome is decided by events and counts (the fake engine holds until the test releases
it; bodies are counted chunk by chunk), never by how fast the machine is.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import socket
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi", reason="needs the serve extra: pip install -e '.[serve]'")
import uvicorn
from fastapi.testclient import TestClient
from test_serve_app import BlockingModel, write_tiny_checkpoint

from transformer_mt.serve import middleware
from transformer_mt.serve.app import create_app
from transformer_mt.serve.limits import Limits
from transformer_mt.serve.model import ServedModel

#: Limits(max_chars=100) reads bodies of at most 12 x 100 + 65536 bytes.
SMALL = Limits(max_chars=100, window_ms=0)
MAX_BYTES = 12 * 100 + 65536


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: Any
    chunks_read: int  # body chunks taken from the client in all
    chunks_at_answer: int  # ... when the answer began


async def call_app(
    app: Any,
    path: str,
    chunks: Iterable[bytes],
    *,
    headers: Iterable[tuple[bytes, bytes]] = (),
    gone: asyncio.Event | None = None,
    method: str = "POST",
) -> Answer:
    """One request straight into the ASGI app: its body sent as ``chunks`` (an endless
    iterator is a body that never ends), the client leaving when ``gone`` is set."""
    source, read = iter(chunks), 0
    ended = False

    async def receive() -> dict[str, Any]:
        nonlocal read, ended
        if not ended:
            chunk = next(source, None)
            if chunk is not None:
                read += 1
                return {"type": "http.request", "body": chunk, "more_body": True}
            ended = True
            return {"type": "http.request", "body": b"", "more_body": False}
        await (gone or asyncio.Event()).wait()  # connected until the request ends
        return {"type": "http.disconnect"}

    sent: list[dict[str, Any]] = []
    at_answer = -1

    async def send(message: dict[str, Any]) -> None:
        nonlocal at_answer
        if message["type"] == "http.response.start":
            at_answer = read
        sent.append(message)

    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method,
        "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"",
        "root_path": "", "headers": [(b"content-type", b"application/json"), *headers],
        "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80),
    }  # fmt: skip
    await app(scope, receive, send)
    start = next(m for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    head = {k.decode(): v.decode() for k, v in start.get("headers", [])}
    return Answer(start["status"], head, json.loads(body) if body else None, read, at_answer)


def request_body(payload: dict[str, Any]) -> list[bytes]:
    return [json.dumps(payload).encode()]


def endless(size: int = 1000) -> Iterator[bytes]:
    while True:
        yield b" " * size


def test_a_chunked_body_over_the_limit_is_refused_as_it_streams() -> None:
    """A body that never ends is answered 413 on the chunk that passes the limit; after the
    answer at most LINGER_BYTES more are read (and dropped) before the connection closes, never
    the rest (it would take forever)."""
    app = create_app(BlockingModel(), SMALL)  # type: ignore[arg-type]
    chunked = [(b"transfer-encoding", b"chunked")]
    answer = asyncio.run(call_app(app, "/translate", endless(1000), headers=chunked))
    assert answer.status == 413 and answer.chunks_at_answer == MAX_BYTES // 1000 + 1
    assert answer.chunks_read <= answer.chunks_at_answer + middleware.LINGER_BYTES // 1000 + 1
    assert f"more than {MAX_BYTES} bytes" in answer.body["error"]
    assert answer.headers["connection"] == "close"
    # A body within the limit, in small chunks, is read whole and answered.
    text = json.dumps({"text": ["hello"]}).encode()
    pieces = [text[i : i + 3] for i in range(0, len(text), 3)]
    model = BlockingModel()
    model.release.set()
    ok = asyncio.run(call_app(create_app(model, SMALL), "/translate", pieces, headers=chunked))  # type: ignore[arg-type]
    assert ok.status == 200 and ok.body["translations"] == ["HELLO"]
    assert ok.chunks_read == len(pieces)


def test_a_declared_body_over_the_limit_is_refused_before_it_is_read() -> None:
    app = create_app(BlockingModel(), SMALL)  # type: ignore[arg-type]
    declared = [(b"content-length", b"400000000")]
    answer = asyncio.run(call_app(app, "/translate", endless(), headers=declared))
    assert answer.status == 413 and answer.chunks_at_answer == 0
    assert answer.chunks_read <= middleware.LINGER_BYTES // 1000 + 1
    assert "400000000 bytes" in answer.body["error"]


@contextlib.contextmanager
def live(app: Any) -> Iterator[int]:
    """``app`` served by uvicorn on 127.0.0.1 in a thread; yields the port."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        while not server.started:  # uvicorn sets it once it serves (the socket already listens)
            thread.join(0.01)
            assert thread.is_alive(), "uvicorn exited before serving"
        yield sock.getsockname()[1]
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()


def read_answer(conn: socket.socket) -> tuple[int, dict[str, str], Any]:
    """Status, headers and JSON body of one HTTP/1.1 answer, read as far as its length."""
    response = http.client.HTTPResponse(conn)
    response.begin()
    headers = {k.lower(): v for k, v in response.getheaders()}
    return response.status, headers, json.loads(response.read())


def test_a_real_server_answers_an_endless_chunked_body_413() -> None:
    """Over a socket, through uvicorn: the body's last chunk is never sent, so an answer at
    all shows the server did not wait to read it; the connection closes after the 413."""
    app = create_app(BlockingModel(), SMALL)  # type: ignore[arg-type]
    with live(app) as port, socket.create_connection(("127.0.0.1", port), timeout=60) as conn:
        conn.sendall(
            b"POST /translate HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n"
        )
        for _ in range(MAX_BYTES // 1000 + 2):  # past the limit, then stop sending
            conn.sendall(b"3e8\r\n" + b" " * 1000 + b"\r\n")
        status, headers, body = read_answer(conn)
    assert status == 413 and headers["connection"] == "close"
    assert f"more than {MAX_BYTES} bytes" in body["error"]


def test_a_client_that_sends_its_whole_large_body_still_reads_the_413(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A body three times the limit, all of it sent before the client reads: the server drops
    what comes after the answer instead of closing on unread bytes, which would reset the
    connection and lose the 413 (the byte bound decides here: the time bound is lifted)."""
    monkeypatch.setattr(middleware, "LINGER_S", 600.0)
    app = create_app(BlockingModel(), SMALL)  # type: ignore[arg-type]
    body = b" " * (3 * MAX_BYTES)
    with live(app) as port, socket.create_connection(("127.0.0.1", port), timeout=60) as conn:
        conn.sendall(
            b"POST /translate HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n"
        )
        for i in range(0, len(body), 8192):
            piece = body[i : i + 8192]
            conn.sendall(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
        conn.sendall(b"0\r\n\r\n")
        status, _, answer = read_answer(conn)
    assert status == 413 and f"more than {MAX_BYTES} bytes" in answer["error"]


def test_a_real_server_refuses_a_declared_length_at_once() -> None:
    app = create_app(BlockingModel(), SMALL)  # type: ignore[arg-type]
    with live(app) as port, socket.create_connection(("127.0.0.1", port), timeout=60) as conn:
        conn.sendall(
            b"POST /translate HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
            b"Content-Length: 400000000\r\n\r\n{"
        )
        status, _, body = read_answer(conn)
    assert status == 413 and "400000000 bytes" in body["error"]


KEY = "s3cret-key"

#: Routes that run the model or say what it is, with a body that would be answered.
GUARDED = [
    ("POST", "/translate", {"text": ["hi"]}),
    ("POST", "/attention", {"text": "hi", "translation": "ha"}),
    ("GET", "/model", None),
    ("GET", "/nothing", None),
]


class AttendingModel(BlockingModel):
    """The fake engine with an attention pass that waits for the test's signal too."""

    def __init__(self) -> None:
        super().__init__()
        self.passes: list[str] = []

    def attention(
        self, source: str, translation: str, *, tgt_lang: str | None = None
    ) -> dict[str, Any]:
        self.passes.append(source)
        self.entered.set()
        assert self.release.wait(30), "the test never released the engine"
        return {"cross": [[[[1.0]]]], "output_tokens": [translation]}

    def attention_values(self, source: str, translation: str) -> int:
        return len(source) * len(translation)


def test_with_a_key_only_its_holders_run_the_model() -> None:
    model = AttendingModel()
    model.release.set()
    with TestClient(create_app(model, api_key=KEY)) as client:  # type: ignore[arg-type]
        for method, path, body in GUARDED:
            for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
                answer = client.request(method, path, json=body, headers=headers)
                assert answer.status_code == 401, (path, headers)
                assert list(answer.json()) == ["error"] and "Bearer" in answer.json()["error"]
                assert answer.headers["www-authenticate"] == "Bearer"
            with_key = client.request(
                method, path, json=body, headers={"Authorization": f"bearer {KEY}"}
            )
            assert with_key.status_code == (404 if path == "/nothing" else 200), path
        # The page, its files, the docs and the health check need no key.
        for path in ("/", "/static/app.js", "/static/style.css", "/health", "/openapi.json"):
            assert client.get(path).status_code == 200, path
        schemes = client.get("/openapi.json").json()["components"]["securitySchemes"]
        assert schemes["HTTPBearer"]["scheme"] == "bearer"  # /docs offers to send it
    assert model.calls == [["hi"]] and model.passes == ["hi"]


def test_a_key_is_checked_before_the_body_is_read() -> None:
    app = create_app(BlockingModel(), SMALL, api_key=KEY)  # type: ignore[arg-type]
    chunked = [(b"transfer-encoding", b"chunked")]
    answer = asyncio.run(call_app(app, "/translate", endless(), headers=chunked))
    assert answer.status == 401 and answer.chunks_at_answer == 0


def test_an_attention_flood_gets_503_and_translate_goes_on() -> None:
    """/attention waits in the queue /translate waits in: with the engine held and the queue
    full of attention passes, the next request of either kind is refused at once; released,
    every queued pass is answered and so is the next translation."""
    model = AttendingModel()
    app = create_app(model, Limits(max_pending=4, window_ms=0))  # type: ignore[arg-type]
    batcher = app.state.service.batcher

    def attend(text: str) -> Any:
        return call_app(app, "/attention", request_body({"text": text, "translation": "x"}))

    async def scenario() -> None:
        holding = asyncio.ensure_future(attend("hold"))
        await asyncio.get_running_loop().run_in_executor(None, model.entered.wait, 30)
        queued = [asyncio.ensure_future(attend(f"a{i}")) for i in range(4)]
        while batcher.pending < 4 and not any(q.done() for q in queued):
            await asyncio.sleep(0)
        refused = await attend("one too many")
        assert refused.status == 503 and "at most 4" in refused.body["error"]
        translate = await call_app(app, "/translate", request_body({"text": ["t"]}))
        assert translate.status == 503
        model.release.set()
        answers = await asyncio.gather(holding, *queued)
        assert [a.status for a in answers] == [200] * 5
        after = await call_app(app, "/translate", request_body({"text": ["t"]}))
        assert after.status == 200 and after.body["translations"] == ["T"]
        await batcher.stop()

    asyncio.run(scenario())
    assert model.passes == ["hold", "a0", "a1", "a2", "a3"]


def test_attention_times_out_and_is_given_up_like_translate() -> None:
    """With the engine held (an answer is impossible until the test releases it), a queued
    attention pass certainly times out (504) and a client that leaves gets 499; neither pass
    ever runs."""
    model = AttendingModel()
    app = create_app(model, Limits(window_ms=0))  # type: ignore[arg-type]
    service = app.state.service

    async def scenario() -> None:
        body = request_body({"text": "hold", "translation": "x"})
        holding = asyncio.ensure_future(call_app(app, "/attention", body))
        await asyncio.get_running_loop().run_in_executor(None, model.entered.wait, 30)
        service.limits = Limits(timeout_s=0.01, window_ms=0)
        late = await call_app(app, "/attention", request_body({"text": "late"}))
        assert late.status == 504 and "no answer within 0.01 s" in late.body["error"]
        service.limits = Limits(window_ms=0)
        gone = asyncio.Event()
        leaving = asyncio.ensure_future(
            call_app(
                app, "/attention", request_body({"text": "gone", "translation": "x"}), gone=gone
            )
        )
        while service.batcher.pending == 0 and not leaving.done():
            await asyncio.sleep(0)
        gone.set()
        assert (await leaving).status == 499
        model.release.set()
        assert (await holding).status == 200
        await service.batcher.stop()

    asyncio.run(scenario())
    assert model.passes == ["hold"] and model.calls == []


@pytest.fixture(scope="module")
def tiny_ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_checkpoint(tmp_path_factory.mktemp("guards") / "tiny.ckpt")


def test_attention_answers_have_a_bounded_size(tiny_ckpt: Path) -> None:
    """The cap counts the weights before the pass runs; the count is the answer's own."""
    model = ServedModel.open(tiny_ckpt)
    source, translation = "one two three", "eins zwei drei"
    values = model.attention_values(source, translation)
    body = {"text": source, "translation": translation}
    with TestClient(create_app(model, Limits(max_attention_values=values))) as client:
        maps = client.post("/attention", json=body).json()
        counted = sum(
            len(row) for kind in ("encoder_self", "decoder_self", "cross")
            for layer in maps[kind] for head in layer for row in head
        )  # fmt: skip
        assert counted == values
        longer = client.post("/attention", json={**body, "translation": translation + " vier"})
        assert longer.status_code == 413
        assert f"at most {values}; send a shorter sentence" in longer.json()["error"]
        assert client.get("/model").json()["limits"]["max_attention_values"] == values
