"""DecodingStep (fixed-shape buffers, the step as a tensor) == Transformer.decode over KVCache."""

from __future__ import annotations

import pytest
import torch

from transformer_mt.inference.search import SearchConfig, Steering, search_batch
from transformer_mt.model.decoding_step import DecodingStep
from transformer_mt.model.transformer import Transformer

from conftest import BOS, EOS, random_batch, tiny_config


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"norm_first": True},
        {"positional": "learned"},
        {"d_k": 4, "d_v": 12},
    ],
    ids=["post-LN", "pre-LN", "learned positions", "d_k != d_v"],
)
def test_step_log_probs_equal_cached_decode(overrides: dict) -> None:
    torch.manual_seed(0)
    model = Transformer(tiny_config(**overrides)).eval()
    src, tgt = random_batch(batch=4, tgt_len=9)
    step = DecodingStep(model)
    with torch.no_grad():
        memory, src_mask = model.encode(src)
        cache = model.new_cache()
        state = step.start(memory, src_mask, length=12)  # room to spare: masked positions
        for t in range(tgt.size(1)):
            token = tgt[:, t : t + 1]
            plain = model.decode(token, memory, src_mask, cache, offset=t)[:, -1]
            expected = plain.float().log_softmax(dim=-1)
            got = step.log_probs(token, torch.tensor(t), state)
            torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("written", [6, 3], ids=["every position", "the written ones"])
def test_step_state_follows_selected_and_reordered_rows(written: int) -> None:
    torch.manual_seed(1)
    model = Transformer(tiny_config()).eval()
    src, tgt = random_batch(batch=4, tgt_len=6)
    step = DecodingStep(model)
    with torch.no_grad():
        memory, src_mask = model.encode(src)
        cache = model.new_cache()
        state = step.start(memory, src_mask, length=6)
        for t in range(3):
            model.decode(tgt[:, t : t + 1], memory, src_mask, cache, offset=t)
            step.log_probs(tgt[:, t : t + 1], torch.tensor(t), state)
        # Finished rows leave (select), then beams swap histories (self-attention only), on
        # both paths alike.
        rows, swap = torch.tensor([3, 1]), torch.tensor([1, 0])
        state.select(rows)
        state.reorder_self(swap, written)
        memory, src_mask = memory[rows], src_mask[rows]
        for self_cache, cross_cache in cache:
            self_cache.reorder(rows)
            cross_cache.reorder(rows)
            self_cache.reorder(swap)
        token = tgt[[1, 3], 3:4]
        plain = model.decode(token, memory, src_mask, cache, offset=3)[:, -1]
        got = step.log_probs(token, torch.tensor(3), state)
    torch.testing.assert_close(got, plain.float().log_softmax(dim=-1), atol=1e-5, rtol=1e-5)


def _search(models, src, steps, **options):
    search = SearchConfig(**options)
    return search_batch(
        models, src, bos_id=BOS, eos_id=EOS, search=search, steer=Steering(),
        decoding_steps=steps,
    )  # fmt: skip


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"beam_size": 4, "nbest": 2},
        {"sampling_topk": 0, "nbest": 2, "seed": 3},
    ],
    ids=["greedy", "beam", "sampling"],
)
def test_searches_through_steps_equal_plain_searches(options: dict) -> None:
    torch.manual_seed(2)
    models = [Transformer(tiny_config()).eval() for _ in range(2)]  # an ensemble
    src, _ = random_batch(batch=5)
    plain = _search(models, src, None, **options)
    stepped = _search(models, src, [DecodingStep(m) for m in models], **options)
    assert [[h.tokens for h in hyps] for hyps in stepped] == [
        [h.tokens for h in hyps] for hyps in plain
    ]
    torch.testing.assert_close(
        torch.tensor([[h.score for h in hyps] for hyps in stepped]),
        torch.tensor([[h.score for h in hyps] for hyps in plain]),
    )


def test_one_step_per_model() -> None:
    models = [Transformer(tiny_config()).eval() for _ in range(2)]
    src, _ = random_batch(batch=2)
    with pytest.raises(ValueError, match="2 models need as many decoding steps, got 1"):
        _search(models, src, [DecodingStep(models[0])])


def test_one_sentence_is_held_as_two_identical_rows() -> None:
    """A single row would be a compiled graph of its own: the state doubles it, the step
    answers for the one row asked."""
    model = Transformer(tiny_config()).eval()
    src, _ = random_batch(batch=1)
    step = DecodingStep(model)
    with torch.no_grad():
        memory, src_mask = model.encode(src)
        state = step.start(memory, src_mask, length=4)
        out = step.log_probs(torch.tensor([[BOS]]), torch.tensor(0), state)
    assert state.rows == 1 and state.self_k[0].size(0) == 2 and out.shape[0] == 1
    torch.testing.assert_close(state.cross_k[0][0], state.cross_k[0][1])
