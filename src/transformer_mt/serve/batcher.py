"""Request batching: concurrent requests share engine calls, each caller gets its own lines back.

A request is a :class:`Job` (its lines, its decoding options, its per-line columns such as
target prefixes, its source-token count and a future). One asyncio task takes the oldest job
and every job queued behind it, within the token budget (``max_tokens``); jobs with equal
options and the same column names go into one engine call, in arrival order, their lines and
columns joined in that order, and the outputs are cut back into one list per job. Engine calls
run on worker threads, so the event loop keeps accepting requests (and filling the next batch)
while a batch decodes: requests gather while the engine is busy.

``lanes`` engine calls may run at once, each on a worker thread of its own: the batching task
takes the next batch as soon as a lane is free, and a batch taken while other lanes are idle is
split between them (consecutive jobs, about equal source tokens each), so that sixteen clients
in step keep two engine worker processes busy rather than one. With one lane (the service's
default) it takes a batch only when the engine is idle. Two lanes of threads in one process
served no more than one, for the torch engine and CTranslate2 alike; lanes of worker processes
(:mod:`~transformer_mt.serve.workers`) each have a core (docs/serve.md, "Batching").

The window is adaptive. A batch waits for company only when company is coming: the clients
the last engine call answered send their next requests a moment later, so a batch waits (at
most ``window_s``) until it holds as many jobs as the last call did. A lone client's request
finds the engine idle and no company expected, and is dispatched at once; sixteen clients
sending back to back share one call instead of splitting into a call for the first to return
and another for the rest.

A caller that gives up (a time-out, a disconnected client) cancels its future: a job not yet
started is dropped before the engine sees it; when every job of the running engine call has
been given up, the call's ``stop`` event is set, and an engine that checks it between decoding
steps (the torch search, :func:`~transformer_mt.inference.search.stop_when`) returns the worker
within one step. Either way the queue moves on. An engine error fails the jobs of that call only.

A job may bring its own engine call (``run``, e.g. an attention pass): it then runs alone, on
every lane at once (nothing else runs beside it: such a call may hook into the model), but
waits in the same queue and counts towards ``max_pending`` like any other.
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
from typing import Any, TypeVar

from transformer_mt.serve.timing import Stopwatch

log = logging.getLogger(__name__)

T = TypeVar("T")

#: ``run(lines, options, *, stop, **columns)`` -> one output per line, in order; blocking. Each
#: column (e.g. ``prefixes``) is a list with one value per line; ``stop`` is a
#: :class:`threading.Event` set once every caller of the call has gone (stop early, with any
#: exception, when it is).
RunBatch = Callable[..., list[Any]]


class QueueFull(RuntimeError):
    """More sentences are waiting than the service accepts; the client should retry later."""


@dataclass(eq=False)
class Job:
    """One request: its lines, its options (hashable), its source tokens and its per-line
    columns (name -> one value per line)."""

    lines: list[str]
    options: Hashable
    tokens: int
    future: asyncio.Future[list[Any]] = field(repr=False)
    columns: dict[str, list[Any]] = field(default_factory=dict)
    #: the job's own engine call (instead of the batcher's); such a job runs alone
    run: RunBatch | None = field(default=None, repr=False)
    #: out of the queue: taken into a batch, or dropped
    taken: bool = False
    #: the request's stopwatch: marked when the job is taken and around its engine call
    watch: Stopwatch | None = field(default=None, repr=False)

    @property
    def key(self) -> Hashable:
        """What a job must share with others to join their engine call: the options and the
        column names. A column can change how the engine decodes every line (constraints take
        the constrained beam search), so jobs with and without it never share a call; a job
        with its own ``run`` shares with none (its key is itself)."""
        if self.run is not None:
            return self
        return self.options, tuple(sorted(self.columns))


class Batcher:
    """Collects jobs into batches and runs them on ``lanes`` worker threads.

    Args:
        run: the engine call, ``run(lines, options) -> outputs``.
        max_tokens: source tokens per batch (a larger job runs alone; the engine splits it).
        window_s: the longest a batch waits for the jobs the last engine call suggests are
            coming (0: only the jobs already queued join).
        max_pending: sentences waiting at most; :meth:`submit` raises :class:`QueueFull` past it
            (a job given up while queued leaves the count at once).
        lanes: engine calls that may run at once (``run`` must then be safe to call from that
            many threads together).
    """

    def __init__(
        self,
        run: RunBatch,
        *,
        max_tokens: int = 4096,
        window_s: float = 0.005,
        max_pending: int = 4096,
        lanes: int = 1,
    ) -> None:
        if max_tokens < 1 or window_s < 0 or max_pending < 1 or lanes < 1:
            raise ValueError(
                f"max_tokens={max_tokens}, window_s={window_s}, max_pending={max_pending}, "
                f"lanes={lanes}: use max_tokens >= 1, window_s >= 0, max_pending >= 1, lanes >= 1"
            )
        self.run, self.max_tokens, self.window_s = run, max_tokens, window_s
        self.max_pending, self.lanes = max_pending, lanes
        self.pending = 0  # sentences queued, not yet taken into a batch
        self.batches = 0  # engine calls so far
        self.stopped = 0  # engine calls told to stop because every caller had gone
        self.expected = 1  # jobs the last batch held: the company the next one waits for
        self._stops: set[threading.Event] = set()  # the running calls', one each
        self._free = asyncio.Semaphore(lanes)  # lanes not running a call
        self._idle = lanes  # the same count, readable: lanes neither running nor taken
        self._calls: set[asyncio.Task[None]] = set()
        self._queue: collections.deque[Job] = collections.deque()
        self._arrived = asyncio.Event()  # set when a job is queued
        self._held: Job | None = None  # the job that did not fit the last batch
        self._task: asyncio.Task[None] | None = None
        self._worker = concurrent.futures.ThreadPoolExecutor(lanes, thread_name_prefix="engine")

    @property
    def running(self) -> int:
        """Engine calls running now."""
        return len(self._stops)

    def start(self) -> None:
        """Start the batching task on the running loop (:meth:`submit` starts it too)."""
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._loop())

    async def stop(self) -> None:
        """Stop taking batches; jobs still queued are cancelled, the running call is told to
        stop."""
        for event in self._stops:
            event.set()
        tasks = [t for t in (self._task, *self._calls) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
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
        """Queue ``lines`` (with ``columns``: one value per line each, passed to ``run`` by
        name) and wait for their outputs (cancel the awaiting task to give up). ``run``: this
        job's own engine call, in place of the batcher's (it then runs alone); ``watch``: the
        request's stopwatch, marked ``queue`` when the job is taken, ``handoff`` and
        ``engine`` at its call's start and end."""
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

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(*args)`` on a worker thread, outside the queue (not counted in
        ``max_pending``, never cancelled: :meth:`submit` a job with its own ``run`` for work a
        client asks for)."""
        return await asyncio.get_running_loop().run_in_executor(self._worker, fn, *args)

    async def _loop(self) -> None:
        while True:
            # A batch is taken only when a lane is free to run it: while every lane is busy,
            # requests gather for the next one.
            await self._acquire()
            try:
                jobs = await self._collect()
            except BaseException:
                self._release()
                raise
            groups: dict[Hashable, list[Job]] = {}
            for job in jobs:
                groups.setdefault(job.key, []).append(job)
            parts = list(groups.values())
            if len(parts) == 1 and parts[0][0].run is None and self._idle > 0:
                # Idle lanes share the batch: on separate cores, two calls of half the
                # sentences end sooner than one call of all of them.
                parts = split(parts[0], 1 + self._idle)
                # The company a lane's next batch waits for is what one lane took: the
                # clients of one part come back together, the other parts' meanwhile busy.
                self.expected = max(len(part) for part in parts)
            held = 1  # the lane acquired for this batch goes to its first group
            for group in parts:
                # A job with its own call runs with nothing beside it: it takes every lane.
                want = self.lanes if group[0].run is not None else 1
                for _ in range(want - held):
                    await self._acquire()
                task = asyncio.get_running_loop().create_task(self._run_group(group, want))
                self._calls.add(task)
                task.add_done_callback(self._calls.discard)
                held = 0

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

    async def _run_group(self, jobs: list[Job], lanes: int) -> None:
        """One engine call over ``jobs`` (equal keys): their lines and columns joined in order;
        then the ``lanes`` it held are free."""
        try:
            await self._call_group(jobs)
        finally:
            for _ in range(lanes):
                self._release()

    async def _acquire(self) -> None:
        await self._free.acquire()
        self._idle -= 1

    def _release(self) -> None:
        self._idle += 1
        self._free.release()

    async def _call_group(self, jobs: list[Job]) -> None:
        jobs = [job for job in jobs if not job.future.done()]
        if not jobs:
            return
        lines = [line for job in jobs for line in job.lines]
        columns = {name: [v for job in jobs for v in job.columns[name]] for name in jobs[0].columns}
        self.batches += 1
        stop = self._stop_when_gone(jobs)
        self._stops.add(stop)
        try:
            run = functools.partial(jobs[0].run or self.run, stop=stop, **columns)
            outputs = await self.call(_timed, run, jobs, lines, jobs[0].options)
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
            self._stops.discard(stop)
        start = 0
        for job in jobs:
            part = outputs[start : start + len(job.lines)]
            start += len(job.lines)
            if not job.future.done():
                job.future.set_result(part)

    def _stop_when_gone(self, jobs: list[Job]) -> threading.Event:
        """An event set (and counted in :attr:`stopped`) once every job of ``jobs`` has been
        cancelled by its caller: nobody waits for the call's outputs any more."""
        stop = threading.Event()

        def gone(_: asyncio.Future[list[Any]]) -> None:
            if not stop.is_set() and all(job.future.cancelled() for job in jobs):
                stop.set()
                self.stopped += 1

        for job in jobs:
            job.future.add_done_callback(gone)
        return stop


def split(jobs: list[Job], parts: int) -> list[list[Job]]:
    """``jobs`` in at most ``parts`` runs of consecutive jobs with about equal source tokens
    (arrival order kept; never an empty run)."""
    parts = max(1, min(parts, len(jobs)))
    total = sum(job.tokens for job in jobs)
    runs: list[list[Job]] = []
    run: list[Job] = []
    seen = 0  # tokens of the jobs placed so far
    for i, job in enumerate(jobs):
        run.append(job)
        seen += job.tokens
        runs_to_come, jobs_to_come = parts - len(runs) - 1, len(jobs) - i - 1
        # Close the run at its share of the tokens, or when each run to come needs a job.
        share_reached = seen * parts >= total * (len(runs) + 1)
        if runs_to_come > 0 and (share_reached or jobs_to_come == runs_to_come):
            runs.append(run)
            run = []
    runs.append(run)
    return runs


def _timed(run: Callable[..., list[Any]], jobs: list[Job], *args: Any) -> list[Any]:
    """``run(*args)`` on the worker thread, its start and end marked on the jobs' stopwatches
    (``handoff`` ends as the call begins, ``engine`` as it returns)."""
    start = time.perf_counter()
    try:
        return run(*args)
    finally:
        end = time.perf_counter()
        for job in jobs:
            if job.watch is not None:
                job.watch.mark("handoff", start)
                job.watch.mark("engine", end)
