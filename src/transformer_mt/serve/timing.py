"""Where one request's time goes, told to the client in a ``Server-Timing`` header (W3C):

    server-timing: read;dur=0.41, check;dur=0.12, queue;dur=0.03, handoff;dur=0.09,
                   engine;dur=11.8, resume;dur=0.07, answer;dur=0.35, total;dur=12.9

Each ``dur`` is in milliseconds, between consecutive marks; ``total`` runs from the headers to
the answer's start. The route and the batcher mark a request's :class:`Stopwatch`
(``request.state.timing``); marking is two clock reads a stage, so every request carries it.
"""

from __future__ import annotations

import time
from typing import Any

#: The stages in the order a request passes them, each named after the mark that ends it;
#: ``answer`` runs from the last mark to the answer's start (docs/serve.md).
STAGES = ("read", "check", "queue", "handoff", "engine", "resume")


class Stopwatch:
    """The moments one request passed, by stage name (``time.perf_counter`` seconds)."""

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.marks: dict[str, float] = {}

    def mark(self, stage: str, at: float | None = None) -> None:
        """``stage`` ended now (or ``at``); a stage marked twice keeps its last moment."""
        self.marks[stage] = time.perf_counter() if at is None else at

    def durations(self, end: float) -> list[tuple[str, float]]:
        """(stage, milliseconds) of each marked stage in :data:`STAGES` order, from the
        previous marked moment, then ``answer`` (when any was marked) and ``total`` up to
        ``end``."""
        out, last = [], self.start
        for stage in STAGES:
            if stage in self.marks:
                at = self.marks[stage]
                out.append((stage, (at - last) * 1000))
                last = at
        if self.marks:
            out.append(("answer", (end - last) * 1000))
        out.append(("total", (end - self.start) * 1000))
        return out


def header(durations: list[tuple[str, float]]) -> bytes:
    """The ``Server-Timing`` value of ``durations``."""
    return ", ".join(f"{name};dur={ms:.3f}" for name, ms in durations).encode()


class ServerTiming:
    """ASGI middleware: a :class:`Stopwatch` per HTTP request in ``scope["state"]["timing"]``,
    and its stages as the answer's ``Server-Timing`` header."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        watch = Stopwatch()
        scope.setdefault("state", {})["timing"] = watch

        async def timed_send(message: Any) -> None:
            if message["type"] == "http.response.start":
                value = header(watch.durations(time.perf_counter()))
                headers = [*message.get("headers", ()), (b"server-timing", value)]
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, timed_send)
