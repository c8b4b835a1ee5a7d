"""Several translation directions in one model: names, target-language tags, the mix.

Every source sentence starts with its target language's tag (``<2en>``; Johnson et al., 2017),
a special token of the joint vocabulary. On the source, not as the decoder's first token, the
tag leaves ``<bos>``, search, scoring and export unchanged. ``data.direction_temperature``
sets how an epoch mixes the directions (:func:`temperature_shares`; docs/training.md).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np

#: A direction ``src-tgt``: two language codes (letters, digits, ``_``) joined by ``-``.
_DIRECTION = re.compile(r"^([A-Za-z0-9_]+)-([A-Za-z0-9_]+)$")
#: The source/target language of a model whose directions do not share one.
MULTIPLE = "mul"


def tag(lang: str) -> str:
    """The target-language tag: ``<2de>`` for German."""
    return f"<2{lang}>"


def parse_directions(values: Sequence[str]) -> list[tuple[str, str]]:
    """``["en-de", "en-fr"]`` -> ``[("en", "de"), ("en", "fr")]``, checked.

    Raises:
        ValueError: a malformed or repeated direction, or one into its own language.
    """
    pairs: list[tuple[str, str]] = []
    for value in values:
        match = _DIRECTION.match(str(value).strip())
        if match is None:
            raise ValueError(
                f"data.directions entry {value!r} is not src-tgt; write e.g. "
                '"data.directions=[en-de,en-fr]"'
            )
        pair = (match.group(1), match.group(2))
        if pair[0] == pair[1]:
            raise ValueError(f"data.directions entry {value!r} translates a language into itself")
        if pair in pairs:
            raise ValueError(f"data.directions names {value!r} twice; list each direction once")
        pairs.append(pair)
    return pairs


def name(pair: tuple[str, str]) -> str:
    return f"{pair[0]}-{pair[1]}"


def summary_languages(pairs: Sequence[tuple[str, str]]) -> tuple[str, str]:
    """The ``(src_lang, tgt_lang)`` of a multilingual model: the shared language, else
    :data:`MULTIPLE` (many-to-English is ``("mul", "en")``)."""
    sources = {s for s, _ in pairs}
    targets = {t for _, t in pairs}
    src = next(iter(sources)) if len(sources) == 1 else MULTIPLE
    tgt = next(iter(targets)) if len(targets) == 1 else MULTIPLE
    return src, tgt


def target_languages(pairs: Sequence[tuple[str, str]]) -> list[str]:
    """The target languages, in the order the directions name them."""
    seen: list[str] = []
    for _, t in pairs:
        if t not in seen:
            seen.append(t)
    return seen


def temperature_shares(sizes: Sequence[int], temperature: float) -> np.ndarray:
    """Each direction's share of an epoch: ``p_i^(1/T) / sum_j p_j^(1/T)``, where ``p_i`` is
    its share of the training pairs (T = 1: ``p`` itself; T -> infinity: uniform)."""
    p = np.asarray(sizes, dtype=np.float64)
    p = p / p.sum()
    q = p ** (1.0 / temperature)
    return q / q.sum()


def sample_epoch(groups: np.ndarray, temperature: float, seed: int) -> np.ndarray | None:
    """The training examples of one epoch under temperature sampling: example indices (with
    repeats) drawn per direction, ``groups`` giving each example's direction number.

    Direction ``i`` gets ``round(share_i * N)`` examples: whole passes over its pairs in a
    fresh order, then part of one more, so no pair repeats before all were drawn. ``None``
    when that is every pair once: the epoch is the corpus itself.
    """
    ids, counts = np.unique(groups, return_counts=True)
    wanted = np.rint(temperature_shares(counts, temperature) * len(groups)).astype(np.int64)
    if np.array_equal(wanted, counts):
        return None
    rng = np.random.default_rng(seed)
    drawn = []
    for group, want in zip(ids.tolist(), wanted.tolist()):
        members = np.flatnonzero(groups == group)
        passes, rest = divmod(max(int(want), 1), len(members))
        drawn += [rng.permutation(members) for _ in range(passes)]
        drawn.append(rng.permutation(members)[:rest])
    return np.sort(np.concatenate(drawn))
