"""Work nobody waits for stops: the searches consult a stop check once per decoding step, the
translator once per engine batch, and the service sets it when every caller of an engine call
has gone (a time-out or a disconnect), so the worker is free one step later.

Steps are counted, not timed: a wrapped decoder counts its calls and holds at a chosen one
until the test lets it go.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("fastapi", reason="needs the serve extra: pip install -e '.[serve]'")
from test_serve_app import SOURCES, write_tiny_checkpoint
from test_serve_guards import call_app, live, read_answer

from transformer_mt.inference.search import (
    DecodingCancelled,
    SearchConfig,
    Steering,
    search_batch,
    stop_when,
)
from transformer_mt.model.transformer import Transformer
from transformer_mt.serve.app import create_app, until_gone
from transformer_mt.serve.limits import Limits
from transformer_mt.serve.model import ServedModel

from conftest import BOS, EOS, tiny_config


class CountingDecoder:
    """Wraps a model's ``decode``: counts the calls (one per decoding step) and, at call
    ``hold_at``, signals :attr:`reached` and waits for :attr:`proceed`."""

    def __init__(self, model: Transformer, hold_at: int | None = None) -> None:
        self.model, self.inner, self.hold_at = model, model.decode, hold_at
        self.calls = 0
        self.reached, self.proceed = threading.Event(), threading.Event()
        model.decode = self  # type: ignore[method-assign]

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        if self.calls == self.hold_at:
            self.reached.set()
            assert self.proceed.wait(30), "the test never let the decoder go on"
        return self.inner(*args, **kwargs)


SEARCHES = {
    "greedy": (SearchConfig(beam_size=1, max_len_a=0, max_len_b=30), None),
    "beam": (SearchConfig(beam_size=3, max_len_a=0, max_len_b=30), None),
    "sampling": (SearchConfig(sampling_topk=0, seed=1, max_len_a=0, max_len_b=30), None),
    "constrained": (
        SearchConfig(beam_size=2, max_len_a=0, max_len_b=30),
        Steering(constraints=[[[5, 6]], [[7]], []]),
    ),
}


@pytest.mark.parametrize("name", list(SEARCHES))
def test_a_search_stops_at_the_step_after_the_signal(name: str) -> None:
    search, steer = SEARCHES[name]
    model = Transformer(tiny_config()).eval()
    src = torch.randint(3, 40, (3, 7))
    decoder = CountingDecoder(model)
    search_batch(model, src, bos_id=BOS, eos_id=EOS, search=search, steer=steer)
    full = decoder.calls
    assert full > 4  # the untrained model runs on: there are steps to save
    decoder.calls, asked = 0, 0

    def should_stop() -> bool:
        nonlocal asked
        asked += 1
        return asked > 3  # three steps decode, the fourth check stops

    with pytest.raises(DecodingCancelled), stop_when(should_stop):
        search_batch(model, src, bos_id=BOS, eos_id=EOS, search=search, steer=steer)
    assert decoder.calls == 3 and asked == 4
    decoder.calls = 0  # outside the block nothing stops: the full search again
    search_batch(model, src, bos_id=BOS, eos_id=EOS, search=search, steer=steer)
    assert decoder.calls == full


@pytest.fixture(scope="module")
def tiny_ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_checkpoint(tmp_path_factory.mktemp("cancel") / "tiny.ckpt")


class CountingEngine:
    """An engine (as CTranslate2's: no per-step check) that counts its batches."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.batches = inner, 0

    def decode_batch(self, batch: dict[str, Any], search: SearchConfig) -> Any:
        self.batches += 1
        return self.inner.decode_batch(batch, search)


def test_an_engine_without_steps_stops_between_its_batches(tiny_ckpt: Path) -> None:
    model = ServedModel.open(tiny_ckpt)
    engine = CountingEngine(model.translator.engine)
    model.translator.engine = engine
    model.translator.max_tokens, model.translator.max_sentences = None, 1  # a batch per line
    search = SearchConfig.from_stored(model.loaded.decoding)
    with pytest.raises(DecodingCancelled):
        model.translate(SOURCES[:4], search, should_stop=lambda: engine.batches >= 2)
    assert engine.batches == 2
    assert len(model.translate(SOURCES[:4], search)) == 4 and engine.batches == 6


def test_until_gone_gives_the_work_up_at_its_time_out() -> None:
    """Work that can never finish and a time-out of 0: certainly a 504, and the work is
    cancelled (which is what tells the batcher its caller has gone)."""

    class Connected:
        async def receive(self) -> dict[str, Any]:
            await asyncio.Event().wait()
            return {}

    async def scenario() -> asyncio.Future[None]:
        work: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        with pytest.raises(Exception, match="no answer within 0 s") as caught:
            await until_gone(Connected(), work, 0)  # type: ignore[arg-type]
        assert caught.value.status == 504  # type: ignore[attr-defined]
        return work

    assert asyncio.run(scenario()).cancelled()


def test_a_client_that_leaves_frees_the_worker_within_one_step(tiny_ckpt: Path) -> None:
    """A long request decodes; at its second step the decoder holds, the client leaves, and
    once the batcher has told the call to stop the decoder goes on: the search ends at the next
    step's check (2 decoder calls in all, not the dozens the request needs), and the next
    request is answered."""
    model = ServedModel.open(tiny_ckpt)
    decoder = CountingDecoder(model.loaded.model, hold_at=2)
    app = create_app(model, Limits(window_ms=0))
    batcher = app.state.service.batcher
    long = {"text": [" ".join(SOURCES[:12])] * 8, "beam_size": 4}
    short = {"text": [SOURCES[0]]}

    async def scenario() -> None:
        gone = asyncio.Event()
        first = asyncio.ensure_future(
            call_app(app, "/translate", [json.dumps(long).encode()], gone=gone)
        )
        await asyncio.get_running_loop().run_in_executor(None, decoder.reached.wait, 30)
        gone.set()
        left = await first
        assert left.status == 499 and left.body["error"] == "the client closed the connection"
        while batcher.stopped == 0:  # the call is told to stop (its one caller has gone)
            await asyncio.sleep(0)
        decoder.proceed.set()
        after = await call_app(app, "/translate", [json.dumps(short).encode()])
        assert after.status == 200 and len(after.body["translations"]) == 1
        await batcher.stop()

    asyncio.run(scenario())
    stopped_at = decoder.calls
    decoder.calls, decoder.hold_at = 0, None
    alone = model.translate(short["text"], model.defaults)  # the short request's own steps
    assert alone and stopped_at - decoder.calls == 2
    decoder.calls = 0
    model.translate(long["text"], SearchConfig.from_stored(model.loaded.decoding, beam_size=4))
    assert decoder.calls > 10  # what the request would have cost


def test_a_real_client_closing_its_socket_stops_the_search(tiny_ckpt: Path) -> None:
    """Through uvicorn: the client sends a long request and closes its socket while the
    decoder holds at its second step; once the server has told the call to stop, the decoder
    goes on, the search ends at the next check, and the next request is answered."""
    model = ServedModel.open(tiny_ckpt)
    decoder = CountingDecoder(model.loaded.model, hold_at=2)
    app = create_app(model, Limits(window_ms=0))
    batcher = app.state.service.batcher
    body = json.dumps({"text": [" ".join(SOURCES[:12])] * 8, "beam_size": 4}).encode()
    with live(app) as port:
        with socket.create_connection(("127.0.0.1", port), timeout=60) as conn:
            conn.sendall(
                b"POST /translate HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
                + f"Content-Length: {len(body)}\r\n\r\n".encode()
                + body
            )
            assert decoder.reached.wait(30)
        for _ in range(30_000):  # the server notices the closed socket
            if batcher.stopped:
                break
            threading.Event().wait(0.001)
        assert batcher.stopped == 1
        decoder.proceed.set()
        with socket.create_connection(("127.0.0.1", port), timeout=60) as conn:
            short = json.dumps({"text": [SOURCES[0]]}).encode()
            conn.sendall(
                b"POST /translate HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
                + f"Content-Length: {len(short)}\r\n\r\n".encode()
                + short
            )
            status, _, answer = read_answer(conn)
        assert status == 200 and len(answer["translations"]) == 1
    after = decoder.calls
    decoder.calls, decoder.hold_at = 0, None
    model.translate([SOURCES[0]], model.defaults)
    assert after - decoder.calls == 2  # the long request cost two decoder calls
