"""The ``generated`` source: the embedded number-sentence data set, no download.

English template sentences with a spelled-out number and their German (or French)
translation (:mod:`transformer_mt.data.numbers`), or the bare number words
(``task="numbers"``). Seeded; validation and test numbers never occur in training.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import datasets
import numpy as np

from transformer_mt.data.config import DEFAULT_SIZES, TASKS
from transformer_mt.data.numbers import number_sentences, spell

log = logging.getLogger(__name__)


def generate_numbers_corpus(
    src_lang: str = "en",
    tgt_lang: str = "de",
    *,
    sizes: Mapping[str, int] | None = None,
    number_range: tuple[int, int] = (2, 99999),
    seed: int = 0,
    task: str = "sentences",
) -> datasets.DatasetDict:
    """Sentences with numbers (``task="sentences"``) or bare number words (``"numbers"``).

    Numbers are drawn without replacement from ``number_range`` (inclusive), so validation
    and test measure generalisation to unseen numbers. Deterministic per ``seed``.

    Raises:
        ValueError: the splits need more distinct numbers than the range has.
    """
    sizes = {k: int(v) for k, v in dict(sizes or DEFAULT_SIZES).items()}
    low, high = int(number_range[0]), int(number_range[1])
    available = high - low + 1
    total = sum(sizes.values())
    if any(v <= 0 for v in sizes.values()):
        raise ValueError(f"Generated split sizes must be positive, got {sizes}.")
    if total > available:
        raise ValueError(
            f"Generated splits need {total} distinct numbers {sizes} but the range "
            f"[{low}, {high}] has {available}; widen data.number_range or shrink data.sizes."
        )
    if task not in TASKS:
        raise ValueError(f"Unknown generated task {task!r}; use data.task=sentences or numbers.")
    rng = np.random.default_rng(seed)
    numbers = low + rng.choice(available, size=total, replace=False)
    out, start = {}, 0
    for split, size in sizes.items():
        chosen = numbers[start : start + size]
        start += size
        if task == "sentences":
            src, tgt = number_sentences(chosen, src_lang, tgt_lang, seed=seed * 7919 + start)
        else:
            src, tgt = spell(chosen, src_lang), spell(chosen, tgt_lang)
        out[split] = datasets.Dataset.from_dict({"src": src, "tgt": tgt})
    log.info(
        "Generated %s %s pairs %s->%s from [%d, %d] (seed %d)",
        sizes,
        task,
        src_lang,
        tgt_lang,
        low,
        high,
        seed,
    )
    return datasets.DatasetDict(out)
