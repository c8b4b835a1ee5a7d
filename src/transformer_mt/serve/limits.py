"""What one request may ask for, and how requests are batched: the service's settings."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Limits:
    """What one request may ask for, and how requests are batched.

    Every value is checked against :data:`RANGES` when the limits are made: a NaN time-out
    (every request would time out at once) or a window of 1e12 ms (none would ever be taken)
    is refused, not served.
    """

    #: sentences per /translate request
    max_sentences: int = 256
    #: characters per request, all sentences together
    max_chars: int = 10_000
    #: the largest beam size a request may ask for
    max_beam: int = 16
    #: seconds a request may wait for its answer (queue + decoding)
    timeout_s: float = 60.0
    #: sentences waiting at most before requests are refused (503); an /attention request
    #: counts one per pass it queues
    max_pending: int = 4096
    #: source tokens per batch of the batcher
    batch_tokens: int = 4096
    #: the longest a batch waits for the requests the last engine call suggests are coming, in
    #: milliseconds (a lone client's request never waits: see the batcher)
    window_ms: float = 5.0
    #: attention weights one /attention answer may hold (layers x heads x pieces x pieces, all
    #: three kinds): about 5 bytes of JSON each, so the default is an answer of about 5 MB
    max_attention_values: int = 1_000_000

    def __post_init__(self) -> None:
        for name, (low, high) in RANGES.items():
            value = getattr(self, name)
            if not (math.isfinite(value) and low <= value <= high):
                raise ValueError(
                    f"{name} is {value}, outside {low:g}..{high:g}; give a finite number in that "
                    "range"
                )


#: The values each limit may take (inclusive): the command line refuses the rest as it parses.
RANGES: dict[str, tuple[float, float]] = {
    "max_sentences": (1, 100_000),
    "max_chars": (1, 1_000_000),
    "max_beam": (1, 128),
    "timeout_s": (0.001, 86_400),
    "max_pending": (1, 1_000_000),
    "batch_tokens": (1, 1_000_000),
    "window_ms": (0, 1000),
    "max_attention_values": (1, 100_000_000),
}
