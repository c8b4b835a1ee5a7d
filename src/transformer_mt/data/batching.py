"""Token-budget batching, like fairseq's ``--max-tokens``.

Examples are sorted by ``max(src_len, tgt_len)`` (ties broken at random per epoch), cut
greedily into batches with ``B * max(S, T) <= max_tokens``, shuffled (seed + epoch) and dealt
to the DDP ranks as ``batches[rank::world_size]``. When the count is not a multiple of
``world_size``, ``uneven="repeat"`` repeats the first batches (every rank runs the same number
of steps, or DDP hangs) and ``"drop"`` drops the leftovers. Only numpy length arrays are
touched, so it is cheap for millions of sentences.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from typing import Literal

import numpy as np

log = logging.getLogger(__name__)


def pack_by_budget(
    order: np.ndarray, sizes: np.ndarray, max_tokens: int, max_sentences: int | None = None
) -> list[np.ndarray]:
    """Cut ``order`` into consecutive batches with ``len(batch) * max(size) <= max_tokens``.

    ``sizes`` is the padded cost per example, indexed by example index; ``max_sentences``
    bounds the examples per batch (``None``: no bound).

    Raises:
        ValueError: one example alone exceeds ``max_tokens``.
    """
    ordered = sizes[order]
    if len(ordered) and int(ordered.max()) > max_tokens:
        worst = int(order[int(ordered.argmax())])
        raise ValueError(
            f"Example {worst} is {int(ordered.max())} tokens long, more than "
            f"max_tokens={max_tokens}; raise max_tokens or lower max_len."
        )
    batches: list[np.ndarray] = []
    start, longest = 0, 0
    # A plain loop over Python ints: fast enough for millions of examples, and obviously right.
    for i, size in enumerate(ordered.tolist()):
        longest_with = max(longest, size)
        full = max_sentences is not None and i - start >= max_sentences
        if full or (i - start + 1) * longest_with > max_tokens:
            batches.append(order[start:i])
            start, longest_with = i, size
        longest = longest_with
    if start < len(order):
        batches.append(order[start:])
    return batches


def padding_efficiency(
    batches: Sequence[Sequence[int] | np.ndarray],
    src_lengths: np.ndarray,
    tgt_lengths: np.ndarray,
) -> float:
    """Fraction of real (non-pad) tokens in the padded source and target tensors."""
    src_lengths, tgt_lengths = np.asarray(src_lengths), np.asarray(tgt_lengths)
    real = padded = 0
    for batch in batches:
        batch = np.asarray(batch)
        if len(batch) == 0:
            continue
        src, tgt = src_lengths[batch], tgt_lengths[batch]
        real += int(src.sum()) + int(tgt.sum())
        padded += len(batch) * (int(src.max()) + int(tgt.max()))
    return real / padded if padded else 1.0


class TokenBudgetBatchSampler:
    """Batch sampler with a token budget, per-epoch shuffling and DDP sharding.

    Each item is a list of example indices; Lightning calls :meth:`set_epoch` each epoch.
    Decoding passes no target lengths (unknown when translating), so the budget counts
    padded source tokens, ``B * max(S)``, and every decoding path batches a test set alike.

    Args:
        src_lengths: Source tensor length per example (specials included).
        tgt_lengths: Target tensor length per example; ``None``: count the source only.
        shuffle: Training mode: random tie-breaks and batch order per epoch; ``False`` sorts.
        seed: Base seed; epoch ``e`` uses ``seed + e``.
        uneven: ``"repeat"`` or ``"drop"`` leftover batches (the module docstring).
        max_sentences: At most this many examples per batch (``None``: no bound).
    """

    def __init__(
        self,
        src_lengths: np.ndarray | Sequence[int],
        tgt_lengths: np.ndarray | Sequence[int] | None,
        max_tokens: int,
        *,
        shuffle: bool = True,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        uneven: Literal["repeat", "drop"] = "repeat",
        max_sentences: int | None = None,
    ) -> None:
        self.src_lengths = np.asarray(src_lengths, dtype=np.int64)
        source_only = tgt_lengths is None
        self.tgt_lengths = (
            np.zeros_like(self.src_lengths)
            if source_only
            else np.asarray(tgt_lengths, dtype=np.int64)
        )
        if self.src_lengths.shape != self.tgt_lengths.shape or self.src_lengths.ndim != 1:
            raise ValueError(
                f"src_lengths {self.src_lengths.shape} and tgt_lengths "
                f"{self.tgt_lengths.shape} must be 1-D arrays of the same length."
            )
        if max_tokens <= 0:
            raise ValueError(f"max_tokens must be positive, got {max_tokens}.")
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"Need 0 <= rank < world_size, got rank={rank}, world={world_size}.")
        if uneven not in ("repeat", "drop"):
            raise ValueError(f"uneven must be 'repeat' or 'drop', got {uneven!r}.")
        if max_sentences is not None and max_sentences < 1:
            raise ValueError(f"max_sentences must be >= 1, got {max_sentences}.")
        self.max_sentences = max_sentences
        self.max_tokens = int(max_tokens)
        self.shuffle = shuffle
        self.seed = int(seed)
        self.rank = rank
        self.world_size = world_size
        self.uneven = uneven
        self.epoch = 0
        self._resume: tuple[int, int] | None = None  # (epoch, batches to skip), see resume()
        self._sizes = np.maximum(self.src_lengths, self.tgt_lengths)  # = src when source_only
        self._cache: tuple[int, list[np.ndarray]] | None = None
        # Tie-breaks leave the sorted sizes, and so the batch count, the same every epoch.
        self._num_batches = len(self._all_batches(0))
        if self._num_batches < world_size and uneven == "drop":
            raise ValueError(
                f"Only {self._num_batches} batches for {world_size} ranks with "
                f"uneven='drop'; lower max_tokens or use uneven='repeat'."
            )

    @property
    def sampler(self) -> TokenBudgetBatchSampler:
        """Itself: Lightning looks for ``set_epoch`` on ``loader.batch_sampler.sampler``."""
        return self

    def set_epoch(self, epoch: int) -> None:
        """Use the shuffles of ``epoch`` (same on every rank)."""
        self.epoch = int(epoch)

    def _all_batches(self, epoch: int) -> list[np.ndarray]:
        """Every batch of ``epoch`` before sharding, in the order they run."""
        if self._cache is not None and self._cache[0] == epoch:
            return self._cache[1]
        n = len(self.src_lengths)
        if self.shuffle:
            rng = np.random.default_rng(self.seed + epoch)
            tie_break = rng.permutation(n)
        else:
            tie_break = np.arange(n)
        # lexsort's last key is primary: the budgeted size first pads least (docs/benchmarks.md).
        order = np.lexsort((tie_break, self.tgt_lengths, self.src_lengths, self._sizes))
        batches = pack_by_budget(order, self._sizes, self.max_tokens, self.max_sentences)
        if self.shuffle:
            batches = [batches[i] for i in rng.permutation(len(batches))]
        self._cache = (epoch, batches)
        return batches

    def batches(self, epoch: int | None = None) -> list[np.ndarray]:
        """This rank's batches for ``epoch`` (default: the current one)."""
        batches = self._all_batches(self.epoch if epoch is None else epoch)
        world = self.world_size
        if world > 1 and len(batches) % world:
            if self.uneven == "drop":
                batches = batches[: len(batches) - len(batches) % world]
            else:
                missing = world - len(batches) % world
                batches = batches + [batches[i % len(batches)] for i in range(missing)]
        return batches[self.rank :: world]

    def resume(self, epoch: int, consumed: int) -> None:
        """Continue ``epoch`` after its first ``consumed`` batches, on the next iteration
        (a mid-epoch resume); a finished epoch resumes at the next one's start.

        It wins over the epoch set so far: Lightning creates the iterator before it calls
        :meth:`set_epoch` for the resumed epoch.
        """
        epoch, consumed = int(epoch), int(consumed)
        if consumed >= len(self):
            epoch, consumed = epoch + 1, 0
        self.epoch = epoch
        self._resume = (epoch, consumed)

    def __iter__(self) -> Iterator[list[int]]:
        resume, self._resume = self._resume, None
        if resume is not None:
            self.epoch = resume[0]
            batches = self.batches(resume[0])[resume[1] :]
        else:
            batches = self.batches()
        for batch in batches:
            yield batch.tolist()

    def __len__(self) -> int:
        n, world = self._num_batches, self.world_size
        if self.uneven == "drop":
            return n // world
        return -(-n // world)  # ceil

    def padding_efficiency(self) -> float:
        """Real-token fraction of this rank's batches in the current epoch."""
        return padding_efficiency(self.batches(), self.src_lengths, self.tgt_lengths)


def decode_sampler(
    src_lengths: np.ndarray | Sequence[int],
    max_tokens: int | None,
    max_sentences: int | None = None,
    rank: int = 0,
    world_size: int = 1,
) -> TokenBudgetBatchSampler:
    """The batches every decoding path uses: sorted by source length, budget ``B * max(S)``.

    Args:
        src_lengths: Source tensor length per example (ids after the cut, plus ``<eos>``).
        max_tokens: Padded source tokens per batch; a longer sentence gets a batch of its
            own. ``None``: no token bound (``max_sentences`` alone).
    """
    lengths = np.asarray(src_lengths, dtype=np.int64)
    budget = 2**62 if max_tokens is None else max(int(max_tokens), int(lengths.max(initial=1)))
    return TokenBudgetBatchSampler(
        lengths,
        None,
        max_tokens=budget,
        shuffle=False,
        rank=rank,
        world_size=world_size,
        max_sentences=max_sentences,
    )
