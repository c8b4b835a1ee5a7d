"""What one request may ask for, and how requests are batched: the service's settings."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any


def _limit(default: float, low: float, high: float, text: str) -> Any:
    """A field with its range (inclusive; the command line refuses the rest as it parses) and
    its ``--help`` text."""
    return field(default=default, metadata={"range": (low, high), "help": text})


@dataclass(frozen=True)
class Limits:
    """What one request may ask for, and how requests are batched. A value outside its range
    (a NaN time-out, a window of 1e12 ms) is refused when the limits are made, not served."""

    max_sentences: int = _limit(256, 1, 100_000, "sentences per request")
    max_chars: int = _limit(10_000, 1, 1_000_000, "characters per request")
    max_beam: int = _limit(16, 1, 128, "largest beam size a request may ask for")
    timeout_s: float = _limit(60.0, 0.001, 86_400, "seconds a request may wait for its answer")
    # An /attention request counts one per pass it queues.
    max_pending: int = _limit(4096, 1, 1_000_000, "sentences waiting before requests get 503")
    batch_tokens: int = _limit(4096, 1, 1_000_000, "source tokens per batch")
    window_ms: float = _limit(
        5.0, 0, 1000, "most milliseconds a batch waits for the requests it expects"
    )
    # About 5 bytes of JSON each: the default is an answer of about 5 MB.
    max_attention_values: int = _limit(
        1_000_000, 1, 100_000_000, "attention weights one /attention answer may hold"
    )

    def __post_init__(self) -> None:
        for limit in fields(self):
            (low, high), value = limit.metadata["range"], getattr(self, limit.name)
            if not (math.isfinite(value) and low <= value <= high):
                raise ValueError(
                    f"{limit.name} is {value}, outside {low:g}..{high:g}; give a finite number in "
                    "that range"
                )
