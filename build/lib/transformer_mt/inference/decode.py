"""The one decode loop: validation/test BLEU in training, evaluate.py and translate.

All three turn batches from :class:`~transformer_mt.data.collate.Collate` (sorted by source
length and cut by :func:`~transformer_mt.data.batching.decode_sampler`'s source-token budget,
sources cut by :func:`~transformer_mt.data.collate.source_limit`) into hypotheses with
:func:`decode_batch`; :func:`decode` runs it over a whole split and puts the results back in
input order by ``batch["index"]``. The trainer calls :func:`decode_batch` from its
``validation_step``/``test_step`` (Lightning drives the loop there) and orders by the same
index at the end of the epoch, so the three paths cannot drift in padding, cutting, batching
or the treatment of empty sources.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch

from transformer_mt.inference.search import SearchConfig, generate
from transformer_mt.model.transformer import Transformer


@torch.no_grad()
def decode_batch(
    model: Transformer, batch: dict[str, Any], bos_id: int, eos_id: int, search: SearchConfig
) -> list[list[int]]:
    """Output ids (no ``<bos>``, cut before ``<eos>``) for each row of ``batch["src"]``.

    A row with an empty source (``<eos>`` alone) gives an empty output without running the
    model: there is nothing to translate.
    """
    src = batch["src"].to(next(model.parameters()).device)  # (B, S)
    out: list[list[int]] = [[] for _ in range(src.size(0))]
    rows = (src[:, 0] != eos_id).nonzero().squeeze(1).tolist()
    if not rows:
        return out
    if len(rows) < src.size(0):
        src = src[rows]
    hyp = generate(model, src, bos_id, eos_id, search).tolist()
    for row, seq in zip(rows, hyp):
        out[row] = seq[: seq.index(eos_id)] if eos_id in seq else seq
    return out


def decode(
    model: Transformer,
    batches: Iterable[dict[str, Any]],
    bos_id: int,
    eos_id: int,
    search: SearchConfig,
    progress: Callable[[int], None] | None = None,
) -> list[list[int]]:
    """Decode every batch; return the output ids in input order (by ``batch["index"]``).

    Args:
        progress: Called with the number of sentences after each batch.
    """
    by_index: dict[int, list[int]] = {}
    for batch in batches:
        hyps = decode_batch(model, batch, bos_id, eos_id, search)
        by_index.update(zip(batch["index"].tolist(), hyps))
        if progress is not None:
            progress(len(hyps))
    return [by_index[i] for i in sorted(by_index)]


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
