"""Token-budget batching: budget, coverage, epochs, DDP ranks, padding efficiency."""

from __future__ import annotations

import gzip

import numpy as np
import pytest

from transformer_mt.data.batching import (
    TokenBudgetBatchSampler,
    pack_by_budget,
    padding_efficiency,
)

from conftest import MULTI30K, load_script


@pytest.fixture(scope="module")
def lengths() -> tuple[np.ndarray, np.ndarray]:
    """Sentence-like lengths: 3..60 tokens, target correlated with source."""
    rng = np.random.default_rng(0)
    src = rng.integers(3, 60, size=5000)
    tgt = np.clip(src + rng.integers(-5, 8, size=5000), 3, None)
    return src, tgt


def budget_cost(batch, src, tgt) -> int:
    return len(batch) * int(max(src[batch].max(), tgt[batch].max()))


def test_batches_respect_budget_and_cover_every_example_once(lengths):
    src, tgt = lengths
    sampler = TokenBudgetBatchSampler(src, tgt, max_tokens=1000, seed=1)
    for epoch in range(3):
        sampler.set_epoch(epoch)
        batches = list(sampler)
        assert len(batches) == len(sampler)
        assert all(budget_cost(b, src, tgt) <= 1000 for b in batches)
        assert sorted(i for b in batches for i in b) == list(range(len(src)))


def test_batches_change_between_epochs_and_repeat_per_epoch(lengths):
    src, tgt = lengths
    sampler = TokenBudgetBatchSampler(src, tgt, max_tokens=1000, seed=1)
    first = list(sampler)
    sampler.set_epoch(1)
    second = list(sampler)
    assert first != second  # batch order shuffled
    assert {tuple(sorted(b)) for b in first} != {tuple(sorted(b)) for b in second}  # contents too
    sampler.set_epoch(0)
    assert list(sampler) == first  # seed + epoch fully determines an epoch
    assert list(TokenBudgetBatchSampler(src, tgt, 1000, seed=2)) != first


def test_sampler_exposes_set_epoch_where_lightning_looks(lengths):
    from lightning.fabric.utilities.data import _set_sampler_epoch
    from torch.utils.data import DataLoader

    src, tgt = lengths
    sampler = TokenBudgetBatchSampler(src, tgt, max_tokens=1000)
    loader = DataLoader(range(len(src)), batch_sampler=sampler)
    _set_sampler_epoch(loader, 5)
    assert sampler.epoch == 5


@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_ranks_get_disjoint_batches_of_equal_count(lengths, world_size):
    src, tgt = lengths
    samplers = [
        TokenBudgetBatchSampler(src, tgt, 1000, seed=7, rank=r, world_size=world_size)
        for r in range(world_size)
    ]
    per_rank = [[i for b in s for i in b] for s in samplers]
    assert len({len(list(s)) for s in samplers} | {len(s) for s in samplers}) == 1
    assert set().union(*map(set, per_rank)) == set(range(len(src)))  # nothing is lost
    # uneven="repeat": only the batches repeated to fill the last round are shared.
    everything = samplers[0]._all_batches(0)
    missing = -len(everything) % world_size
    repeated = {i for b in everything[:missing] for i in b}
    for a in range(world_size):
        for b in range(a + 1, world_size):
            assert set(per_rank[a]) & set(per_rank[b]) <= repeated
    assert sum(map(len, per_rank)) == len(src) + len([i for b in everything[:missing] for i in b])


def test_ranks_are_disjoint_with_drop(lengths):
    src, tgt = lengths
    ranks = [
        [
            i
            for b in TokenBudgetBatchSampler(src, tgt, 1000, rank=r, world_size=3, uneven="drop")
            for i in b
        ]
        for r in range(3)
    ]
    assert all(not (set(ranks[a]) & set(ranks[b])) for a in range(3) for b in range(a + 1, 3))
    assert (
        len(
            {
                len(TokenBudgetBatchSampler(src, tgt, 1000, rank=r, world_size=3, uneven="drop"))
                for r in range(3)
            }
        )
        == 1
    )


def test_eval_order_is_deterministic_and_sorted(lengths):
    src, tgt = lengths
    sampler = TokenBudgetBatchSampler(src, tgt, 1000, shuffle=False)
    batches = list(sampler)
    sampler.set_epoch(3)
    assert list(sampler) == batches
    sizes = [int(np.maximum(src, tgt)[b].max()) for b in batches]
    assert sizes == sorted(sizes)


def test_pack_by_budget_rejects_examples_longer_than_budget():
    with pytest.raises(ValueError, match=r"Example 1 is 50 tokens.*max_tokens=40"):
        pack_by_budget(np.arange(3), np.array([10, 50, 5]), max_tokens=40)


def test_padding_efficiency_definition():
    src, tgt = np.array([2, 4, 3]), np.array([4, 4, 1])
    # Batch [0, 1]: src 2+4 of 2*4, tgt 4+4 of 2*4. Batch [2]: 3 of 3, 1 of 1.
    assert padding_efficiency([[0, 1], [2]], src, tgt) == pytest.approx((6 + 8 + 4) / (8 + 8 + 4))


@pytest.mark.skipif(not (MULTI30K / "train.en.gz").is_file(), reason="no Multi30k copy")
def test_bucketing_beats_90_percent_on_multi30k_word_lengths():
    """Word counts (+ specials) stand in for subword lengths; scripts/data_stats.py measures BPE."""

    def word_lengths(name: str) -> np.ndarray:
        with gzip.open(MULTI30K / name, "rt", encoding="utf-8") as f:
            return np.array([len(line.split()) for line in f])

    src, tgt = word_lengths("train.en.gz") + 1, word_lengths("train.de.gz") + 2
    sampler = TokenBudgetBatchSampler(src, tgt, max_tokens=4096)
    bucketed = sampler.padding_efficiency()
    shuffled = padding_efficiency(
        load_script("data_stats").random_order_batches(src, tgt, 4096), src, tgt
    )
    assert bucketed >= 0.9 > shuffled
