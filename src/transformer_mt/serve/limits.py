"""What one request may ask for, and how requests are batched: the service's settings."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Limits:
    """What one request may ask for, and how requests are batched."""

    #: sentences per /translate request
    max_sentences: int = 256
    #: characters per request, all sentences together
    max_chars: int = 10_000
    #: the largest beam size a request may ask for
    max_beam: int = 16
    #: seconds a request may wait for its answer (queue + decoding)
    timeout_s: float = 60.0
    #: sentences waiting at most before requests are refused (503)
    max_pending: int = 4096
    #: source tokens per batch of the batcher
    batch_tokens: int = 4096
    #: how long the first request of a batch waits for others, in milliseconds
    window_ms: float = 5.0
