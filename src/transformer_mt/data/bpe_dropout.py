"""BPE-dropout (Provilkov, Emelianenko and Voita, 2020): a new segmentation of the training
set every epoch.

Each applicable merge is skipped with probability ``p``, so the model also sees the pieces of
words it would otherwise see whole; only training sentences are sampled (docs/data.md). The
merges run here because the ``tokenizers`` library's dropout is unseeded and skipped where
``ignore_merges`` or its cache answers; with ``p = 0`` the ids equal the library's (a test).

Each epoch draws from ``seed + epoch`` alone (so a resume replays it): every word type gets at
most ``samples_per_type`` draws, dealt out to its occurrences, which keeps an epoch's cost at
the number of word types rather than word tokens.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from tokenizers import Tokenizer as HFTokenizer


class BpeDropout:
    """Stochastic BPE over one ``tokenizers`` byte-level BPE model.

    Raises:
        ValueError: ``p`` out of range, or the tokenizer is not a BPE model.
    """

    def __init__(self, tokenizer: HFTokenizer, p: float) -> None:
        if not 0.0 <= p < 1.0:
            raise ValueError(f"bpe_dropout must be in [0, 1), got {p}; e.g. data.bpe_dropout=0.1")
        spec = json.loads(tokenizer.to_str())
        model = spec.get("model") or {}
        if model.get("type") != "BPE":
            raise ValueError(f"BPE-dropout needs a BPE tokenizer, got {model.get('type')!r}")
        self.p = float(p)
        self.vocab: dict[str, int] = dict(model["vocab"])
        self.ranks: dict[tuple[str, str], int] = {}
        for rank, merge in enumerate(model["merges"]):
            left, right = merge.split(" ") if isinstance(merge, str) else merge
            self.ranks[(left, right)] = rank
        self._tokenizer = tokenizer

    def words(self, text: str) -> list[str]:
        """The pre-tokenizer's words (byte-level symbols), as the library's encode sees them."""
        normalizer = self._tokenizer.normalizer
        if normalizer is not None:
            text = normalizer.normalize_str(text)
        return [word for word, _ in self._tokenizer.pre_tokenizer.pre_tokenize_str(text)]

    def segment(self, word: str, rand: random.Random | None = None) -> list[int]:
        """Ids of one word: merges lowest rank first, each skipped with probability ``p`` (and
        a candidate again at the next step); done when a step applies none (the paper's)."""
        symbols = list(word)
        draw = rand.random if rand is not None and self.p > 0 else None
        ranks = self.ranks
        while len(symbols) > 1:
            best, best_rank = -1, -1
            for i in range(len(symbols) - 1):
                rank = ranks.get((symbols[i], symbols[i + 1]))
                if rank is None or (best_rank >= 0 and rank >= best_rank):
                    continue
                if draw is not None and draw() < self.p:
                    continue
                best, best_rank = i, rank
            if best < 0:
                break
            symbols[best : best + 2] = [symbols[best] + symbols[best + 1]]
        return [self.vocab[s] for s in symbols]


@dataclass
class _Side:
    """One side of the training set as word types: ``types[k]`` is a word, ``tokens`` the
    type index of every word occurrence in corpus order, ``offsets`` where each sentence's
    words start in ``tokens``."""

    types: list[str]
    tokens: np.ndarray
    offsets: np.ndarray


def _index_words(dropout: BpeDropout, texts: Sequence[str]) -> _Side:
    index: dict[str, int] = {}
    tokens: list[int] = []
    offsets = [0]
    for text in texts:
        for word in dropout.words(text):
            tokens.append(index.setdefault(word, len(index)))
        offsets.append(len(tokens))
    return _Side(list(index), np.asarray(tokens, dtype=np.int64), np.asarray(offsets))


class EpochSegmentation:
    """The training sentences' ids for each epoch under BPE-dropout.

    Args:
        src, tgt: The tokenizers of the two sides (the same object for a joint vocabulary).
        src_texts, tgt_texts: The training sentences, row-aligned.
        samples_per_type: The most fresh draws of one word type per epoch.
    """

    def __init__(
        self,
        src: HFTokenizer,
        tgt: HFTokenizer,
        src_texts: Sequence[str],
        tgt_texts: Sequence[str],
        *,
        p: float,
        seed: int = 0,
        samples_per_type: int = 16,
    ) -> None:
        if len(src_texts) != len(tgt_texts):
            raise ValueError(f"{len(src_texts)} sources but {len(tgt_texts)} targets")
        if samples_per_type < 1:
            raise ValueError(f"samples_per_type must be >= 1, got {samples_per_type}")
        self.p, self.seed, self.samples_per_type = float(p), int(seed), int(samples_per_type)
        self._sides = []
        for tokenizer, texts in ((src, src_texts), (tgt, tgt_texts)):
            dropout = BpeDropout(tokenizer, p)
            self._sides.append((dropout, _index_words(dropout, texts)))
        self._cache: tuple[int, list[list[int]], list[list[int]]] | None = None

    def ids(self, epoch: int) -> tuple[list[list[int]], list[list[int]]]:
        """Source and target ids of every training row in ``epoch`` (no specials)."""
        if self._cache is None or self._cache[0] != epoch:
            # One stream per side and epoch: the two sides are drawn independently.
            src, tgt = (
                self._draw(dropout, side, random.Random(f"{self.seed}:{epoch}:{k}"))
                for k, (dropout, side) in enumerate(self._sides)
            )
            self._cache = (epoch, src, tgt)
        return self._cache[1], self._cache[2]

    def lengths(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        src, tgt = self.ids(epoch)
        return (
            np.fromiter(map(len, src), dtype=np.int64, count=len(src)),
            np.fromiter(map(len, tgt), dtype=np.int64, count=len(tgt)),
        )

    def _draw(self, dropout: BpeDropout, side: _Side, rand: random.Random) -> list[list[int]]:
        counts = np.bincount(side.tokens, minlength=len(side.types))
        draws = [
            [dropout.segment(word, rand) for _ in range(min(int(count), self.samples_per_type))]
            for word, count in zip(side.types, counts)
        ]
        # Occurrence j of a type (in a shuffled order) takes draw j mod the type's draws.
        order = np.random.default_rng(rand.getrandbits(64)).permutation(len(side.tokens))
        sorted_tokens = side.tokens[order]
        by_type = np.argsort(sorted_tokens, kind="stable")
        rank = np.empty(len(side.tokens), dtype=np.int64)
        starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
        rank[by_type] = np.arange(len(side.tokens)) - np.repeat(starts, counts)
        choice = np.empty(len(side.tokens), dtype=np.int64)
        choice[order] = rank
        pieces = [
            draws[t][c % len(draws[t])] for t, c in zip(side.tokens.tolist(), choice.tolist())
        ]
        offsets = side.offsets.tolist()
        return [
            [i for piece in pieces[offsets[r] : offsets[r + 1]] for i in piece]
            for r in range(len(offsets) - 1)
        ]
