"""Stopping a search between two decoding steps when its caller has gone (the service)."""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator


class DecodingCancelled(RuntimeError):
    """A search stopped between two decoding steps because its caller asked (:func:`stop_when`)."""


#: The check every search in this context consults once per step (``None``: never stop).
_SHOULD_STOP: contextvars.ContextVar[Callable[[], bool] | None] = contextvars.ContextVar(
    "should_stop", default=None
)


@contextlib.contextmanager
def stop_when(should_stop: Callable[[], bool] | None) -> Iterator[None]:
    """Within the block, each search on this thread calls ``should_stop()`` once per decoding
    step (:func:`check_stop`) and raises :class:`DecodingCancelled` once it is true.

    Scoped rather than an argument, so that it reaches the search through any engine and the
    decode loop without their interfaces changing: the service sets it when every caller of an
    engine call has gone, and the worker is free again one step later.
    """
    token = _SHOULD_STOP.set(should_stop)
    try:
        yield
    finally:
        _SHOULD_STOP.reset(token)


def check_stop() -> None:
    """Raise :class:`DecodingCancelled` if the check of :func:`stop_when` says so."""
    should_stop = _SHOULD_STOP.get()
    if should_stop is not None and should_stop():
        raise DecodingCancelled("decoding stopped between two steps: its caller asked")
