"""Token-budget batching, like fairseq's ``--max-tokens``.

Sentences vary from 3 to 50+ tokens; a fixed number of sentences per batch
either wastes the accelerator on short batches or runs out of memory on long
ones, and random grouping fills tensors with padding. Instead we

1. sort examples by ``max(src_len, tgt_len)`` -- the quantity the budget
   counts -- then by source and target length, with remaining ties broken
   at random per epoch so batches of equal lengths differ between epochs;
2. cut the sorted list greedily into batches whose *padded* size stays
   within budget: ``batch_size * max(max_src_len, max_tgt_len) <= max_tokens``;
3. shuffle the order of the batches (seed + epoch) and deal them out to the
   data-parallel ranks, ``batches[rank::world_size]``, so ranks are disjoint.

Uneven counts across ranks: when the number of batches is not a multiple of
``world_size`` the first few batches of the shuffled list are *repeated* to
fill the last round (``uneven="repeat"``, like ``DistributedSampler``'s
default), so every rank runs the same number of steps (DDP would hang
otherwise) and every example is still seen each epoch. ``uneven="drop"``
drops the leftover batches instead (a different few each epoch). Repeated
eval examples can be recognised by their ``index``.

Everything works on length arrays (numpy), never on token lists, so it is
cheap for millions of sentences.
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

    Args:
        order: Example indices in the order to pack them.
        sizes: Padded cost per example (e.g. ``max(src_len, tgt_len)``),
            indexed by example index.
        max_tokens: The budget per batch, padding included.
        max_sentences: At most this many examples per batch (``None``: no bound).

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
    """Fraction of real (non-pad) tokens in the padded source and target tensors.

    For each batch the tensors hold ``B * max(src)`` and ``B * max(tgt)``
    positions, of which ``sum(src) + sum(tgt)`` are real tokens.
    """
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

    Pass it as ``DataLoader(dataset, batch_sampler=...)``; each item is a list
    of example indices. Lightning calls :meth:`set_epoch` on a loader's
    ``batch_sampler`` at the start of each epoch (with
    ``use_distributed_sampler=False`` it leaves the sampler alone).

    Decoding (validation and test in training, evaluate.py, translate) passes no target
    lengths: the budget then counts padded *source* tokens, ``B * max(S)``, the one meaning
    of ``data.eval_max_tokens``; a target is unknown when translating, so the batches of a
    test set are the same in all three.

    Args:
        src_lengths: Source tensor length per example (specials included).
        tgt_lengths: Target tensor length per example; ``None``: count the source only.
        max_tokens: Padded tokens per batch: ``B * max(S, T) <= max_tokens``.
        shuffle: Training mode: random tie-breaks and batch order per epoch.
            ``False`` gives a deterministic order sorted by length.
        seed: Base seed; epoch ``e`` uses ``seed + e``.
        rank: This data-parallel rank.
        world_size: Number of data-parallel ranks.
        uneven: ``"repeat"`` or ``"drop"`` leftover batches so every rank
            gets the same number (see the module docstring).
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
        # The batch count does not depend on the epoch: tie-breaks permute
        # examples of equal lengths, which leaves the sorted sizes, and hence
        # the cuts, unchanged.
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
        # lexsort's last key is primary: the budgeted size, then source, target, tie-break.
        # Sorting by the budgeted size first pads less than sorting by the source first
        # (docs/benchmarks.md, "batching").
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
        """Continue ``epoch`` after its first ``consumed`` batches, on the next iteration.

        Used when training resumes from a mid-epoch checkpoint, so that the rest of the epoch
        sees exactly the batches an uninterrupted run would have seen. The resumed position
        wins over the epoch set so far: Lightning creates the training iterator (and a
        ``DataLoader`` with workers starts drawing batches) *before* it calls
        :meth:`set_epoch` for the epoch being resumed, so an iteration that waited for
        ``set_epoch`` would replay epoch 0's order in epoch >= 1. A checkpoint written after
        the last batch of an epoch resumes at the start of the next epoch.
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
        max_tokens: Padded source tokens per batch; a sentence longer than the budget gets a
            batch of its own. ``None``: no token bound (``max_sentences`` alone).
        max_sentences: At most this many sentences per batch.
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


def random_order_batches(
    src_lengths: np.ndarray, tgt_lengths: np.ndarray, max_tokens: int, seed: int = 0
) -> list[np.ndarray]:
    """Baseline for comparison: the same budget, examples in random order."""
    src_lengths, tgt_lengths = np.asarray(src_lengths), np.asarray(tgt_lengths)
    order = np.random.default_rng(seed).permutation(len(src_lengths))
    return pack_by_budget(order, np.maximum(src_lengths, tgt_lengths), max_tokens)
