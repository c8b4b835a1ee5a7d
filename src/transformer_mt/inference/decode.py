"""The one decode loop over the one engine interface: validation, evaluate.py, translate, score.

Every path turns batches from :class:`~transformer_mt.data.collate.Collate` (sorted by source
length and cut by :func:`~transformer_mt.data.batching.decode_sampler`'s source-token budget,
sources cut by :func:`~transformer_mt.data.collate.source_limit`) into hypotheses with an
:class:`Engine`'s ``decode_batch``; :func:`decode` runs it over a whole split and puts the
results back in input order by ``batch["index"]``. The trainer calls ``decode_batch`` from its
``validation_step``/``test_step`` (Lightning drives the loop there) and orders by the same
index at the end of the epoch, so the paths cannot drift in padding, cutting, batching or the
treatment of empty sources. :func:`score` does the same for forced decoding (``score_batch``).

Engines: :class:`~transformer_mt.inference.engine.TorchEngine` (one model or an ensemble) and
:class:`~transformer_mt.inference.ctranslate2_engine.CTranslate2Engine`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Protocol, TypeVar

from transformer_mt.inference.search import Hypothesis, SearchConfig

T = TypeVar("T")


class Engine(Protocol):
    """What the decode loop needs from a model: batches in, hypotheses (or scores) out.

    ``batch`` is a collated batch: ``batch["src"] (B, S)`` holds source ids + ``<eos>``, padded;
    a row that is ``<eos>`` alone (an empty source) gives one empty hypothesis with score 0.
    """

    def decode_batch(self, batch: dict[str, Any], search: SearchConfig) -> list[list[Hypothesis]]:
        """The ``search.nbest`` best hypotheses of each row, best first."""
        ...

    def score_batch(self, batch: dict[str, Any]) -> list[list[float]]:
        """Log-probability of each token of each given target (``batch["tgt"]``: ``<bos>`` +
        ids + ``<eos>``, padded) under the model: one float per id and one for ``<eos>``."""
        ...


def _in_order(
    step: Callable[[dict[str, Any]], list[T]],
    batches: Iterable[dict[str, Any]],
    progress: Callable[[int], None] | None,
) -> list[T]:
    by_index: dict[int, T] = {}
    for batch in batches:
        results = step(batch)
        by_index.update(zip(batch["index"].tolist(), results))
        if progress is not None:
            progress(len(results))
    return [by_index[i] for i in sorted(by_index)]


def decode(
    engine: Engine,
    batches: Iterable[dict[str, Any]],
    search: SearchConfig,
    progress: Callable[[int], None] | None = None,
) -> list[list[Hypothesis]]:
    """Decode every batch; the n-best lists in input order (by ``batch["index"]``).

    Args:
        progress: Called with the number of sentences after each batch.
    """
    return _in_order(lambda batch: engine.decode_batch(batch, search), batches, progress)


def score(
    engine: Engine,
    batches: Iterable[dict[str, Any]],
    progress: Callable[[int], None] | None = None,
) -> list[list[float]]:
    """Token log-probabilities of every batch's targets, in input order (forced decoding)."""
    return _in_order(engine.score_batch, batches, progress)


def best_tokens(nbest_lists: Iterable[list[Hypothesis]]) -> list[list[int]]:
    """The ids of the best hypothesis of each n-best list."""
    return [hyps[0].tokens for hyps in nbest_lists]


class progress_bar:
    """A rich progress bar on stderr (or nothing) as a context giving ``advance(n)``."""

    def __init__(self, enabled: bool, total: int, label: str = "translating") -> None:
        self.enabled, self.total, self.label = enabled, total, label
        self._bar: Any = None

    def __enter__(self) -> Callable[[int], None]:
        if not self.enabled:
            return lambda n: None
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self._bar = Progress(
            TextColumn(self.label),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=Console(stderr=True),
            transient=True,
        )
        self._bar.start()
        task = self._bar.add_task(self.label, total=self.total)
        return lambda n: self._bar.advance(task, n)

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.stop()
