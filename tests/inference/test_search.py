"""Greedy and beam search: cache == no cache, beam 1 == greedy, lengths, stopping."""

from __future__ import annotations

import pytest
import torch

from transformer_mt.inference.search import SearchConfig, beam_search, generate, greedy_search
from transformer_mt.model.transformer import Transformer

from conftest import BOS, EOS, PAD, random_batch, tiny_config


@pytest.mark.parametrize("norm_first", [False, True])
def test_cached_decoding_equals_uncached_logits(norm_first: bool) -> None:
    model = Transformer(tiny_config(norm_first=norm_first)).eval()
    src, tgt = random_batch()
    full = model(src, tgt)  # (B, T, V) in one pass
    memory, src_mask = model.encode(src)
    cache = model.new_cache()
    steps = [
        model.decode(tgt[:, t : t + 1], memory, src_mask, cache, offset=t)
        for t in range(tgt.size(1))
    ]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-5)


def test_greedy_cache_equals_no_cache(tiny_model: Transformer) -> None:
    src, _ = random_batch(batch=5)
    a = greedy_search(tiny_model, src, BOS, EOS, use_cache=True)
    b = greedy_search(tiny_model, src, BOS, EOS, use_cache=False)
    assert torch.equal(a, b)


def test_beam_cache_equals_no_cache(tiny_model: Transformer) -> None:
    src, _ = random_batch(batch=4)
    a, sa = beam_search(tiny_model, src, BOS, EOS, beam_size=3, use_cache=True)
    b, sb = beam_search(tiny_model, src, BOS, EOS, beam_size=3, use_cache=False)
    assert torch.equal(a, b)
    torch.testing.assert_close(sa, sb)


def test_beam_one_equals_greedy(tiny_model: Transformer) -> None:
    src, _ = random_batch(batch=6)
    greedy = greedy_search(tiny_model, src, BOS, EOS)
    beam, _ = beam_search(tiny_model, src, BOS, EOS, beam_size=1)
    assert torch.equal(greedy, beam)


def test_greedy_matches_step_by_step_argmax(tiny_model: Transformer) -> None:
    src, _ = random_batch(batch=1)
    out = greedy_search(tiny_model, src, BOS, EOS, max_len_a=0, max_len_b=6)
    prefix = torch.tensor([[BOS]])
    for t in range(out.size(1)):
        logits = tiny_model(src, prefix)[:, -1]
        logits[:, [PAD, BOS]] = float("-inf")
        token = EOS if t == 5 else int(logits.argmax())
        assert int(out[0, t]) == token
        prefix = torch.cat([prefix, torch.tensor([[token]])], dim=1)


@torch.no_grad()
def _sequence_logprob(model: Transformer, src: torch.Tensor, hyp: list[int]) -> float:
    tgt_in = torch.tensor([[BOS, *hyp[:-1]]])
    lp = model(src, tgt_in).log_softmax(-1)[0]
    return float(sum(lp[t, tok] for t, tok in enumerate(hyp)))


def test_beam_scores_are_normalised_log_probabilities(tiny_model: Transformer) -> None:
    src, _ = random_batch(batch=2)
    tokens, scores = beam_search(tiny_model, src, BOS, EOS, beam_size=3, alpha=0.0)
    for b in range(2):
        hyp = [int(t) for t in tokens[b] if t != PAD]
        assert hyp[-1] == EOS
        expected = _sequence_logprob(tiny_model, src[b : b + 1], hyp)
        assert abs(expected - float(scores[b])) < 1e-4


def test_beam_finds_at_least_greedy_score(tiny_model: Transformer) -> None:
    src, _ = random_batch(batch=4)
    greedy = greedy_search(tiny_model, src, BOS, EOS)
    beam, _ = beam_search(tiny_model, src, BOS, EOS, beam_size=5, alpha=0.0)
    for b in range(4):
        g = [int(t) for t in greedy[b] if t != PAD]
        h = [int(t) for t in beam[b] if t != PAD]
        g_score = _sequence_logprob(tiny_model, src[b : b + 1], g)
        h_score = _sequence_logprob(tiny_model, src[b : b + 1], h)
        assert h_score >= g_score - 1e-4


def test_output_length_cap(tiny_model: Transformer) -> None:
    src, _ = random_batch(batch=3)
    src_len = (src != PAD).sum(1)
    for beam_size in (1, 3):
        out = generate(
            tiny_model, src, BOS, EOS, SearchConfig(beam_size=beam_size, max_len_a=0.5, max_len_b=2)
        )
        for b in range(3):
            hyp = [int(t) for t in out[b] if t != PAD]
            assert hyp[-1] == EOS
            assert len(hyp) <= int(0.5 * src_len[b] + 2)


def test_every_row_ends_with_eos_then_padding(tiny_model: Transformer) -> None:
    src, _ = random_batch(batch=5)
    out = generate(tiny_model, src, BOS, EOS, SearchConfig(beam_size=2))
    for row in out.tolist():
        end = row.index(EOS)
        assert all(t == PAD for t in row[end + 1 :])
        assert PAD not in row[:end] and BOS not in row[:end]


def test_search_config_rejects_bad_beam() -> None:
    with pytest.raises(ValueError, match="beam_size must be >= 1, got 0"):
        SearchConfig(beam_size=0)
