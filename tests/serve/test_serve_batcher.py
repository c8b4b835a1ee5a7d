"""The service's batcher, driven directly with asyncio: which jobs share an engine call is decided
by what is queued and by controlled events, never by the machine's speed."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from transformer_mt.serve.batcher import Batcher, QueueFull


class Stopped(RuntimeError):
    """What the fake engine raises when the batcher tells it to stop (as a search would)."""


class Engine:
    """Records each call; a call whose lines include ``"hold"`` waits for :attr:`release`, one
    with ``"until stopped"`` for the batcher's ``stop`` (then raises :class:`Stopped`)."""

    def __init__(self) -> None:
        self.calls: list[tuple[list[str], Any]] = []
        self.columns: list[dict[str, list[Any]]] = []  # the per-line columns of each call
        self.holding = threading.Event()
        self.release = threading.Event()

    def __call__(
        self, lines: list[str], options: Any, *, stop: threading.Event, **columns: list[Any]
    ) -> list[str]:
        self.calls.append((list(lines), options))
        self.columns.append(columns)
        if "hold" in lines:
            self.holding.set()
            assert self.release.wait(30), "the test never released the engine"
        if "until stopped" in lines:
            self.holding.set()
            assert stop.wait(30), "the batcher never told the engine to stop"
            raise Stopped("stopped")
        if "boom" in lines:
            raise RuntimeError("the engine failed")
        prefixes = columns.get("prefixes", [""] * len(lines))
        return [f"{prefix}{line}:{options}" for prefix, line in zip(prefixes, lines)]


async def held(batcher: Batcher, engine: Engine) -> asyncio.Future:
    """Start a job that holds the engine busy, and wait until it does."""
    job = asyncio.ensure_future(batcher.submit(["hold"], "a", 1))
    await asyncio.get_running_loop().run_in_executor(None, engine.holding.wait, 30)
    return job


def run(scenario: Any) -> None:
    asyncio.run(scenario())


def test_queued_requests_share_one_call_and_each_gets_its_own_lines_in_order() -> None:
    engine = Engine()

    async def scenario() -> None:
        batcher = Batcher(engine, max_tokens=100, window_s=0)
        # All three are queued before the batching task first runs.
        jobs = [batcher.submit(lines, "a", len(lines)) for lines in (["x", "y"], ["z"], ["w"])]
        results = await asyncio.gather(*jobs)
        assert results == [["x:a", "y:a"], ["z:a"], ["w:a"]]
        assert batcher.batches == 1
        await batcher.stop()

    run(scenario)
    assert engine.calls == [(["x", "y", "z", "w"], "a")]


def test_the_token_budget_cuts_batches_and_a_large_job_runs_alone() -> None:
    engine = Engine()

    async def scenario() -> None:
        batcher = Batcher(engine, max_tokens=6, window_s=0)
        sizes = {"p": 3, "q": 3, "r": 3, "big": 50, "s": 1}
        results = await asyncio.gather(*(batcher.submit([k], "a", v) for k, v in sizes.items()))
        assert [r[0] for r in results] == [f"{k}:a" for k in sizes]
        await batcher.stop()

    run(scenario)
    assert [lines for lines, _ in engine.calls] == [["p", "q"], ["r"], ["big"], ["s"]]


def test_only_requests_with_equal_options_share_a_call() -> None:
    engine = Engine()

    async def scenario() -> None:
        batcher = Batcher(engine, max_tokens=100, window_s=0)
        keys = ["beam1", "beam4", "beam1", "beam4", "beam1"]
        results = await asyncio.gather(
            *(batcher.submit([str(i)], k, 1) for i, k in enumerate(keys))
        )
        assert [r[0] for r in results] == [f"{i}:{k}" for i, k in enumerate(keys)]
        await batcher.stop()

    run(scenario)
    assert engine.calls == [(["0", "2", "4"], "beam1"), (["1", "3"], "beam4")]


def test_a_lone_request_is_dispatched_at_once_however_long_the_window() -> None:
    """No engine call has answered several jobs yet, so no company is expected: the first job
    goes alone at once rather than waiting out an hour's window."""
    engine = Engine()

    async def scenario() -> None:
        batcher = Batcher(engine, max_tokens=100, window_s=3600)
        assert await asyncio.wait_for(batcher.submit(["x"], "a", 1), 30) == ["x:a"]
        assert await asyncio.wait_for(batcher.submit(["y"], "a", 1), 30) == ["y:a"]
        await batcher.stop()

    run(scenario)
    assert engine.calls == [(["x"], "a"), (["y"], "a")]


async def taken(batcher: Batcher) -> None:
    """Until every queued job has been taken: the batching task then waits in its window."""
    while batcher.pending:
        await asyncio.sleep(0)


def test_after_a_shared_call_the_next_batch_waits_for_as_many_jobs() -> None:
    """Two jobs shared the last call, so the next batch waits for a second job (the budget is
    not full and the window is an hour: only the second job's arrival ends the wait)."""
    engine = Engine()

    async def scenario() -> None:
        batcher = Batcher(engine, max_tokens=100, window_s=3600)
        assert await asyncio.gather(batcher.submit(["x"], "a", 1), batcher.submit(["y"], "a", 1))
        first = asyncio.ensure_future(batcher.submit(["z"], "a", 1))
        while batcher.pending == 0:  # "z" is queued ...
            await asyncio.sleep(0)
        await taken(batcher)  # ... and taken
        second = await batcher.submit(["w"], "a", 1)
        assert await first == ["z:a"] and second == ["w:a"]
        await batcher.stop()

    run(scenario)
    assert engine.calls == [(["x", "y"], "a"), (["z", "w"], "a")]


def test_a_window_that_ends_without_company_lowers_what_is_expected() -> None:
    """With a zero window the awaited company never comes: the batch goes as it is, and the
    next lone job (one expected now) goes at once too."""
    engine = Engine()

    async def scenario() -> None:
        batcher = Batcher(engine, max_tokens=100, window_s=0)
        await asyncio.gather(batcher.submit(["x"], "a", 1), batcher.submit(["y"], "a", 1))
        assert batcher.expected == 2
        assert await batcher.submit(["z"], "a", 1) == ["z:a"]
        assert batcher.expected == 1
        await batcher.stop()

    run(scenario)
    assert engine.calls == [(["x", "y"], "a"), (["z"], "a")]


def test_a_caller_that_gives_up_never_blocks_the_queue() -> None:
    """A cancelled queued job is dropped before the engine sees it; the result of a running job
    whose caller left is thrown away; later jobs are answered."""
    engine = Engine()

    async def scenario() -> None:
        batcher = Batcher(engine, max_tokens=100, window_s=0)
        running = await held(batcher, engine)
        gone = asyncio.ensure_future(batcher.submit(["gone"], "a", 1))
        stays = asyncio.ensure_future(batcher.submit(["stays"], "a", 1))
        while batcher.pending < 2:
            await asyncio.sleep(0)
        gone.cancel()
        running.cancel()  # its caller leaves while the engine works on it
        engine.release.set()
        assert await stays == ["stays:a"]
        with pytest.raises(asyncio.CancelledError):
            await gone
        assert await batcher.submit(["next"], "a", 1) == ["next:a"]
        await batcher.stop()

    run(scenario)
    assert [lines for lines, _ in engine.calls] == [["hold"], ["stays"], ["next"]]


def test_an_engine_error_fails_that_call_only() -> None:
    engine = Engine()

    async def scenario() -> None:
        batcher = Batcher(engine, max_tokens=100, window_s=0)
        bad = batcher.submit(["boom"], "x", 1)
        good = batcher.submit(["fine"], "y", 1)
        results = await asyncio.gather(bad, good, return_exceptions=True)
        assert isinstance(results[0], RuntimeError) and results[1] == ["fine:y"]
        assert await batcher.submit(["again"], "x", 1) == ["again:x"]
        await batcher.stop()

    run(scenario)


def test_a_full_queue_refuses_new_work_and_recovers() -> None:
    engine = Engine()

    async def scenario() -> None:
        batcher = Batcher(engine, max_tokens=100, window_s=0, max_pending=3)
        running = await held(batcher, engine)
        waiting = asyncio.ensure_future(batcher.submit(["a", "b", "c"], "a", 3))
        while batcher.pending < 3:
            await asyncio.sleep(0)
        with pytest.raises(QueueFull, match="at most 3"):
            await batcher.submit(["d"], "a", 1)
        engine.release.set()
        assert await running == ["hold:a"] and await waiting == ["a:a", "b:a", "c:a"]
        assert await batcher.submit(["d"], "a", 1) == ["d:a"]
        await batcher.stop()

    run(scenario)


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="max_tokens >= 1"):
        Batcher(Engine(), max_tokens=0)


def test_coalesced_jobs_get_their_own_prefixes_back() -> None:
    """Jobs with prefixes share a call, their columns joined in line order; a job without the
    column (which could change how every line decodes) gets a call of its own."""
    engine = Engine()

    async def scenario() -> None:
        batcher = Batcher(engine, max_tokens=100, window_s=0)
        jobs = [
            batcher.submit(["x", "y"], "a", 2, columns={"prefixes": ["P ", "Q "]}),
            batcher.submit(["z"], "a", 1),
            batcher.submit(["w"], "a", 1, columns={"prefixes": ["R "]}),
            batcher.submit(["v"], "b", 1, columns={"prefixes": ["S "]}),
        ]
        results = await asyncio.gather(*jobs)
        assert results == [["P x:a", "Q y:a"], ["z:a"], ["R w:a"], ["S v:b"]]
        await batcher.stop()

    run(scenario)
    assert engine.calls == [(["x", "y", "w"], "a"), (["z"], "a"), (["v"], "b")]
    assert engine.columns == [{"prefixes": ["P ", "Q ", "R "]}, {}, {"prefixes": ["S "]}]


def test_a_column_needs_one_value_per_line() -> None:
    engine = Engine()

    async def scenario() -> None:
        batcher = Batcher(engine, max_tokens=100, window_s=0)
        with pytest.raises(ValueError, match="column 'prefixes' has 1 values for 2 lines"):
            await batcher.submit(["x", "y"], "a", 2, columns={"prefixes": ["P "]})
        assert batcher.pending == 0
        await batcher.stop()

    run(scenario)
    assert engine.calls == []


def test_a_queued_job_given_up_leaves_the_pending_count_at_once() -> None:
    """Its place is free while the engine is still busy: dead jobs never fill the queue."""
    engine = Engine()

    async def scenario() -> None:
        batcher = Batcher(engine, max_tokens=100, window_s=0, max_pending=2)
        running = await held(batcher, engine)
        gone = asyncio.ensure_future(batcher.submit(["a", "b"], "a", 2))
        while batcher.pending < 2:
            await asyncio.sleep(0)
        with pytest.raises(QueueFull):
            await batcher.submit(["c"], "a", 1)
        gone.cancel()
        with pytest.raises(asyncio.CancelledError):
            await gone
        assert batcher.pending == 0  # the engine is still held
        later = asyncio.ensure_future(batcher.submit(["c", "d"], "a", 2))
        while batcher.pending < 2:
            await asyncio.sleep(0)
        engine.release.set()
        assert await running == ["hold:a"] and await later == ["c:a", "d:a"]
        await batcher.stop()

    run(scenario)
    assert [lines for lines, _ in engine.calls] == [["hold"], ["c", "d"]]


def test_the_running_call_is_told_to_stop_once_every_caller_has_gone() -> None:
    """Two jobs share the call: the first leaving changes nothing, the second leaving sets the
    call's stop event (counted); the engine returns, and the queue goes on."""
    engine = Engine()

    async def scenario() -> None:
        batcher = Batcher(engine, max_tokens=100, window_s=0)
        first = asyncio.ensure_future(batcher.submit(["until stopped"], "a", 1))
        second = asyncio.ensure_future(batcher.submit(["x"], "a", 1))
        await asyncio.get_running_loop().run_in_executor(None, engine.holding.wait, 30)
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
        assert batcher.stopped == 0  # the second caller still waits
        waiting = asyncio.ensure_future(batcher.submit(["next"], "a", 1))
        second.cancel()
        with pytest.raises(asyncio.CancelledError):
            await second
        assert batcher.stopped == 1
        assert await waiting == ["next:a"]  # the engine stopped, the worker is free
        await batcher.stop()

    run(scenario)
    assert [lines for lines, _ in engine.calls] == [["until stopped", "x"], ["next"]]


def test_a_job_with_its_own_call_runs_alone_and_counts_as_pending() -> None:
    """As /attention's passes do: queued with the others, within ``max_pending``, never
    joined to another job's call."""
    engine = Engine()
    passes: list[list[str]] = []

    def attend(lines: list[str], options: Any, *, stop: threading.Event) -> list[str]:
        passes.append(list(lines))
        return [f"maps of {line}" for line in lines]

    async def scenario() -> None:
        batcher = Batcher(engine, max_tokens=100, window_s=0, max_pending=2)
        running = await held(batcher, engine)
        own = [asyncio.ensure_future(batcher.submit([t], "a", 1, run=attend)) for t in "pq"]
        while batcher.pending < 2:
            await asyncio.sleep(0)
        with pytest.raises(QueueFull):
            await batcher.submit(["r"], "a", 1, run=attend)
        with pytest.raises(QueueFull):
            await batcher.submit(["r"], "a", 1)
        engine.release.set()
        assert await running == ["hold:a"]
        assert [await job for job in own] == [["maps of p"], ["maps of q"]]
        await batcher.stop()

    run(scenario)
    assert passes == [["p"], ["q"]] and [lines for lines, _ in engine.calls] == [["hold"]]


def test_a_job_with_its_own_call_waits_its_turn_and_runs_alone() -> None:
    """An attention pass hooks the model: it starts only once the running call has ended, and
    a job queued behind it waits until it is done."""
    engine = Engine()
    order: list[str] = []

    def translate(lines: list[str], options: Any, *, stop: threading.Event) -> list[str]:
        order.append(f"call {lines}")
        return engine(lines, options, stop=stop)

    def attend(lines: list[str], options: Any, *, stop: threading.Event) -> list[str]:
        order.append(f"attend {lines}")
        return [f"maps of {line}" for line in lines]

    async def scenario() -> None:
        batcher = Batcher(translate, max_tokens=100, window_s=0)
        running = await held(batcher, engine)
        own = asyncio.ensure_future(batcher.submit(["p"], "a", 1, run=attend))
        behind = asyncio.ensure_future(batcher.submit(["x"], "b", 1))
        for _ in range(100):
            await asyncio.sleep(0)
        assert not own.done() and not behind.done() and len(order) == 1
        engine.release.set()
        assert await running == ["hold:a"]
        assert await own == ["maps of p"] and await behind == ["x:b"]
        await batcher.stop()

    run(scenario)
    assert order == ["call ['hold']", "attend ['p']", "call ['x']"]
