"""Request batching: concurrent requests share engine calls, each caller gets its own lines back.

One asyncio task takes the oldest :class:`Job` and those queued behind it within the token
budget; jobs with equal options and column names share one engine call, run on a worker thread
so the next batch gathers meanwhile. A batch waits (at most ``window_s``) for as many jobs as
the last call answered, since those clients send again a moment later. A caller that gives up
is dropped, and a call whose callers all left is told to stop; an engine error fails only the
jobs of its call.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import functools
import logging
import threading
import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from transformer_mt.serve.timing import Stopwatch

log = logging.getLogger(__name__)

#: ``run(lines, options, *, stop, **columns)`` -> one output per line, in order; blocking. Each
#: column (e.g. ``prefixes``) holds one value per line; ``stop`` is a :class:`threading.Event`
#: set once every caller has gone.
RunBatch = Callable[..., list[Any]]


class QueueFull(RuntimeError):
    """More sentences are waiting than the service accepts; the client should retry later."""


@dataclass(eq=False)
class Job:
    """One request: its lines, options (hashable), source tokens and per-line columns."""

    lines: list[str]
    options: Hashable
    tokens: int
    future: asyncio.Future[list[Any]] = field(repr=False)
    columns: dict[str, list[Any]] = field(default_factory=dict)
    run: RunBatch | None = field(default=None, repr=False)  # its own call: runs alone
    taken: bool = False  # out of the queue: taken into a batch, or dropped
    watch: Stopwatch | None = field(default=None, repr=False)

    @property
    def key(self) -> Hashable:
        """What jobs share to share a call: the options and the column names (a column such as
        constraints changes how every line decodes); a job with its own ``run`` shares none."""
        if self.run is not None:
            return self
        return self.options, tuple(sorted(self.columns))


class Batcher:
    """Collects jobs into batches of at most ``max_tokens`` source tokens (a larger job runs
    alone) and runs them one at a time; at most ``max_pending`` sentences wait (else
    :class:`QueueFull`), and a batch waits at most ``window_s`` for the company it expects."""

    def __init__(
        self,
        run: RunBatch,
        *,
        max_tokens: int = 4096,
        window_s: float = 0.005,
        max_pending: int = 4096,
    ) -> None:
        if max_tokens < 1 or window_s < 0 or max_pending < 1:
            raise ValueError(
                f"max_tokens={max_tokens}, window_s={window_s}, max_pending={max_pending}: use "
                "max_tokens >= 1, window_s >= 0, max_pending >= 1"
            )
        self.run, self.max_tokens, self.window_s = run, max_tokens, window_s
        self.max_pending = max_pending
        self.pending = 0  # sentences queued, not yet taken into a batch
        self.batches = 0  # engine calls so far
        self.stopped = 0  # engine calls told to stop because every caller had gone
        self.expected = 1  # jobs the last batch held: the company the next one waits for
        self._stop: threading.Event | None = None  # the running call's
        self._queue: collections.deque[Job] = collections.deque()
        self._arrived = asyncio.Event()  # set when a job is queued
        self._held: Job | None = None  # the job that did not fit the last batch
        self._task: asyncio.Task[None] | None = None
        self._worker = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="engine")

    def start(self) -> None:
        """Start the batching task on the running loop (:meth:`submit` starts it too)."""
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._loop())

    async def stop(self) -> None:
        """Stop: the running call is told to stop, the queued jobs are cancelled."""
        if self._stop is not None:
            self._stop.set()
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        self._task = None
        while self._queue:
            self._take().future.cancel()
        self._worker.shutdown(wait=False)

    async def submit(
        self,
        lines: list[str],
        options: Hashable,
        tokens: int,
        *,
        columns: Mapping[str, Sequence[Any]] | None = None,
        run: RunBatch | None = None,
        watch: Stopwatch | None = None,
    ) -> list[Any]:
        """Queue ``lines`` (``columns``: one value per line each, passed to ``run`` by name)
        and wait for their outputs; cancel the awaiting task to give up. ``run``: this job's
        own engine call; ``watch``: marked when the job is taken and around its call."""
        per_line = {name: list(values) for name, values in (columns or {}).items()}
        for name, values in per_line.items():
            if len(values) != len(lines):
                raise ValueError(
                    f"column {name!r} has {len(values)} values for {len(lines)} lines; give one "
                    "per line"
                )
        if self.pending + len(lines) > self.max_pending:
            raise QueueFull(
                f"{self.pending} sentences are waiting, the service queues at most "
                f"{self.max_pending}; retry later"
            )
        self.start()
        future = asyncio.get_running_loop().create_future()
        job = Job(lines, options, tokens, future, per_line, run, watch=watch)
        self.pending += len(lines)
        self._queue.append(job)
        self._arrived.set()
        try:
            return await job.future
        finally:
            if not job.taken:  # given up while queued: its place is free at once
                self._queue.remove(job)
                job.taken = True
                self.pending -= len(lines)

    async def _loop(self) -> None:
        while True:  # a batch is taken once the engine is free: requests gather meanwhile
            groups: dict[Hashable, list[Job]] = {}
            for job in await self._collect():
                groups.setdefault(job.key, []).append(job)
            for group in groups.values():
                await self._call_group(group)

    async def _next(self, timeout: float | None) -> Job | None:
        """The held-over job, else a queued one, waiting at most ``timeout`` (None: forever)."""
        if self._held is not None:
            job, self._held = self._held, None
            return job
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while not self._queue:
            # Waiting on an event, not on a queue get: a time-out can then never lose a job.
            self._arrived.clear()
            remaining = None if deadline is None else deadline - loop.time()
            if remaining is not None and remaining <= 0:
                return None
            try:
                await asyncio.wait_for(self._arrived.wait(), remaining)
            except asyncio.TimeoutError:
                return None
        return self._take()

    def _take(self) -> Job:
        """The oldest queued job, out of the queue and the pending count."""
        job = self._queue.popleft()
        job.taken = True
        self.pending -= len(job.lines)
        if job.watch is not None:
            job.watch.mark("queue")
        return job

    async def _collect(self) -> list[Job]:
        """The next batch: the oldest live job, then every job queued behind it, and those
        still expected within the window, all within the budget."""
        loop = asyncio.get_running_loop()
        first = await self._next(None)
        while first is not None and first.future.done():  # its caller has gone
            first = await self._next(None)
        assert first is not None
        jobs, tokens = [first], first.tokens
        deadline = loop.time() + self.window_s
        while tokens < self.max_tokens:
            # Wait only for company that is expected; else take what is queued and go.
            wait = deadline - loop.time() if len(jobs) < self.expected else 0
            job = await self._next(wait)
            if job is None:
                break
            if job.future.done():
                continue
            if tokens + job.tokens > self.max_tokens:
                self._held = job  # first of the next batch
                break
            jobs.append(job)
            tokens += job.tokens
        self.expected = len(jobs)
        return jobs

    async def _call_group(self, jobs: list[Job]) -> None:
        jobs = [job for job in jobs if not job.future.done()]
        if not jobs:
            return
        lines = [line for job in jobs for line in job.lines]
        columns = {name: [v for job in jobs for v in job.columns[name]] for name in jobs[0].columns}
        self.batches += 1
        stop = self._stop = self._stop_when_gone(jobs)
        try:
            run = functools.partial(jobs[0].run or self.run, stop=stop, **columns)
            loop = asyncio.get_running_loop()
            outputs = await loop.run_in_executor(
                self._worker, _timed, run, jobs, lines, jobs[0].options
            )
            if len(outputs) != len(lines):
                raise RuntimeError(f"the engine returned {len(outputs)} outputs for {len(lines)}")
        except Exception as err:
            if stop.is_set():
                log.info("engine call on %d sentences stopped: nobody waits for it", len(lines))
            else:
                log.exception("engine call on %d sentences failed", len(lines))
            for job in jobs:
                if not job.future.done():
                    job.future.set_exception(err)
            return
        finally:
            self._stop = None
        start = 0
        for job in jobs:
            part = outputs[start : start + len(job.lines)]
            start += len(job.lines)
            if not job.future.done():
                job.future.set_result(part)

    def _stop_when_gone(self, jobs: list[Job]) -> threading.Event:
        """An event set (and counted) once every caller of ``jobs`` has gone."""
        stop = threading.Event()

        def gone(_: asyncio.Future[list[Any]]) -> None:
            if not stop.is_set() and all(job.future.cancelled() for job in jobs):
                stop.set()
                self.stopped += 1

        for job in jobs:
            job.future.add_done_callback(gone)
        return stop


def _timed(run: Callable[..., list[Any]], jobs: list[Job], *args: Any) -> list[Any]:
    """``run(*args)`` on the worker thread: ``handoff`` ends as it begins, ``engine`` as it
    returns."""
    start = time.perf_counter()
    try:
        return run(*args)
    finally:
        end = time.perf_counter()
        for job in jobs:
            if job.watch is not None:
                job.watch.mark("handoff", start)
                job.watch.mark("engine", end)
