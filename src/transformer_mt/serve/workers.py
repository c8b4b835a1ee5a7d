"""Engine worker processes: each holds the model and decodes one engine call at a time.

One process runs a torch search's Python on one core at a time (the GIL), and a small engine
call (the sixteen sentences of sixteen clients) keeps one core busy with it: a second thread
in the same process takes turns with the first (docs/serve.md, "Batching"). ``--workers N``
starts N processes instead, each with its own interpreter, model and share of the threads;
the service's own process keeps HTTP, validation and batching, and hands each batch to an idle
worker.

A call travels as the lines, the search and the steering columns (pickled over a pipe) and
comes back as the translations or the error the engine raised, re-raised in the caller. A
caller's ``stop`` event reaches the worker through a shared event that the worker's search
checks once per step (:func:`~transformer_mt.inference.search.stop_when`). A worker that dies
fails the call it was running; the next call on its slot starts a new one.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import multiprocessing.connection
import pickle
import queue
import signal
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

#: How often a waiting call looks at its stop event (the answer itself is read the moment it
#: arrives).
POLL_S = 0.05
#: How long a worker may take to load the model and say it is ready.
START_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class WorkerSpec:
    """What each worker opens: ``opener(list(ckpt), engine=..., ...)``, which is
    :meth:`ServedModel.open` (passed in, and pickled by name, so that this module need not
    import the model's), with one lane and its threads; a CTranslate2 engine from the directory
    the service's own engine opened or converted."""

    opener: Callable[..., Any]
    ckpt: tuple[str, ...]
    engine: str = "torch"
    ct2_model: str | None = None
    compute_type: str | None = None
    compile: bool = False
    threads: int = 1
    tgt_lang: str | None = None


def _serve(spec: WorkerSpec, conn: multiprocessing.connection.Connection, stop: Any) -> None:
    """A worker's life: open the model, say ready (or why not), then answer calls until the
    pipe closes or says ``None``."""
    import torch

    # Ctrl-C in a terminal reaches the whole process group: the service handles it and closes
    # its workers, which would otherwise each print a traceback.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    torch.set_num_threads(max(1, spec.threads))
    try:
        model = spec.opener(
            list(spec.ckpt), engine=spec.engine, ct2_model=spec.ct2_model,
            compute_type=spec.compute_type, threads=spec.threads, tgt_lang=spec.tgt_lang,
            compile=spec.compile,
        )  # fmt: skip
    except Exception as err:  # the parent reports it as the start-up error
        conn.send(("error", f"{type(err).__name__}: {err}"))
        return
    conn.send(("ready", None))
    while True:
        try:
            request = conn.recv()
        except (EOFError, OSError):  # the service has gone
            return
        if request is None:
            return
        lines, search, kwargs = request
        try:
            reply = ("ok", model.translate(lines, search, should_stop=stop.is_set, **kwargs))
        except Exception as err:  # re-raised in the caller
            reply = ("raise", _picklable(err))
        try:
            conn.send(reply)
        except OSError:  # the service has gone while this call ran
            return


def _picklable(err: Exception) -> Exception:
    """``err`` itself when it survives the pipe, else its nearest built-in class (a
    ``SettingError`` arrives as the ``ValueError`` it is) with its message."""
    try:
        pickle.loads(pickle.dumps(err))
    except Exception:
        builtin = next(c for c in type(err).__mro__ if c.__module__ == "builtins")
        return builtin(str(err))
    return err


class _Worker:
    """One worker process, its pipe and its stop event."""

    def __init__(self, spec: WorkerSpec, index: int) -> None:
        context = multiprocessing.get_context("spawn")  # no forked copy of torch's threads
        self.index = index
        self.stop = context.Event()
        self.conn, child = context.Pipe()
        self.process = context.Process(
            target=_serve, args=(spec, child, self.stop), name=f"engine-{index}", daemon=True
        )
        self.process.start()
        child.close()

    def ready(self, timeout: float) -> None:
        """Wait until the model is loaded; a ``ValueError`` with the worker's own reason when
        it could not load it."""
        if not self.conn.poll(timeout):
            self.close()
            raise TimeoutError(f"engine worker {self.index} did not start within {timeout:g} s")
        try:
            kind, message = self.conn.recv()
        except EOFError:
            kind, message = "error", f"exited with code {self.process.exitcode}"
        if kind != "ready":
            self.close()
            raise ValueError(f"engine worker {self.index} could not open the model: {message}")

    def call(self, request: tuple[Any, ...], should_stop: Callable[[], bool] | None) -> Any:
        if not self.process.is_alive():
            raise RuntimeError(f"engine worker {self.index} has exited")
        if should_stop is not None and should_stop():  # gone before it started
            self.stop.set()
        else:
            self.stop.clear()
        self.conn.send(request)
        while not self.conn.poll(POLL_S):
            if should_stop is not None and should_stop():
                self.stop.set()
            if not self.process.is_alive() and not self.conn.poll(0):
                raise RuntimeError(
                    f"engine worker {self.index} exited (code {self.process.exitcode}) during "
                    "the call"
                )
        kind, value = self.conn.recv()
        if kind == "raise":
            raise value
        return value

    def close(self, timeout: float = 5.0) -> None:
        with contextlib.suppress(OSError, ValueError):  # the pipe is already closed
            self.conn.send(None)
        self.process.join(timeout)
        if self.process.is_alive():
            self.process.terminate()
            self.process.join(timeout)
        self.conn.close()


class WorkerPool:
    """``count`` engine worker processes; :meth:`translate` runs a call on an idle one.

    Safe to call from as many threads as there are workers (the batcher's lanes): a call takes
    an idle worker, blocking while none is.
    """

    def __init__(self, spec: WorkerSpec, count: int, *, start_timeout: float = START_TIMEOUT_S):
        if count < 1:
            raise ValueError(f"workers={count}: use 1 or more")
        self.spec, self.count = spec, count
        # Last in, first out: a lone client keeps meeting the worker whose caches are warm.
        self._idle: queue.LifoQueue[_Worker] = queue.LifoQueue()
        self._all: list[_Worker] = []
        # All start at once (each loads the model), then each is waited for.
        started = [_Worker(spec, i) for i in range(count)]
        try:
            for worker in started:
                worker.ready(start_timeout)
        except BaseException:
            for worker in started:
                worker.close(timeout=1.0)
            raise
        for worker in started:
            self._all.append(worker)
            self._idle.put(worker)

    def translate(
        self,
        lines: Sequence[str],
        search: Any,
        *,
        should_stop: Callable[[], bool] | None = None,
        **kwargs: Any,
    ) -> Any:
        """:meth:`ServedModel.translate` of ``lines`` on an idle worker (blocking); once
        ``should_stop()`` is true, its search stops at the next step, as in the service's own
        process. A worker found dead is replaced first (its last call failed)."""
        worker = self._idle.get()
        try:
            if not worker.process.is_alive():
                worker = self._replace(worker)
            return worker.call((list(lines), search, kwargs), should_stop)
        finally:
            self._idle.put(worker)

    def _replace(self, dead: _Worker) -> _Worker:
        log.error("engine worker %d has exited (code %s); starting another", dead.index,
                  dead.process.exitcode)  # fmt: skip
        dead.close(timeout=1.0)
        fresh = _Worker(self.spec, dead.index)
        fresh.ready(START_TIMEOUT_S)
        self._all[self._all.index(dead)] = fresh
        return fresh

    @property
    def pids(self) -> list[int]:
        return [w.process.pid for w in self._all if w.process.pid is not None]

    def close(self) -> None:
        """Tell every worker to exit, and wait for them (terminated past a few seconds)."""
        for worker in self._all:
            worker.close()
        self._all.clear()
