"""Greedy and beam search: cache == no cache, beam 1 == greedy, lengths, stopping."""

from __future__ import annotations

import pytest
import torch

from transformer_mt.inference.search import (
    SearchConfig,
    beam_search,
    greedy_search,
    length_penalty,
    search_batch,
)
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


def _search(model, src, **options) -> list:
    """The n-best lists of ``search_batch`` (greedy or beam by ``beam_size``)."""
    return search_batch(model, src, bos_id=BOS, eos_id=EOS, search=SearchConfig(**options))


def _best(nbest_lists: list) -> list[list[int]]:
    return [hyps[0].tokens for hyps in nbest_lists]


def test_greedy_cache_equals_no_cache(tiny_model: Transformer) -> None:
    src, _ = random_batch(batch=5)
    a = _search(tiny_model, src, use_cache=True)
    b = _search(tiny_model, src, use_cache=False)
    assert _best(a) == _best(b)
    for x, y in zip(a, b):
        assert abs(x[0].score - y[0].score) < 1e-5


def test_beam_cache_equals_no_cache(tiny_model: Transformer) -> None:
    src, _ = random_batch(batch=4)
    a = _search(tiny_model, src, beam_size=3, nbest=3, use_cache=True)
    b = _search(tiny_model, src, beam_size=3, nbest=3, use_cache=False)
    assert [[h.tokens for h in hyps] for hyps in a] == [[h.tokens for h in hyps] for hyps in b]
    torch.testing.assert_close(
        torch.tensor([[h.score for h in hyps] for hyps in a]),
        torch.tensor([[h.score for h in hyps] for hyps in b]),
    )


def test_beam_one_equals_greedy(tiny_model: Transformer) -> None:
    src, _ = random_batch(batch=6)
    greedy = greedy_search(tiny_model, src, bos_id=BOS, eos_id=EOS, search=SearchConfig())
    beam = beam_search(tiny_model, src, bos_id=BOS, eos_id=EOS, search=SearchConfig(beam_size=1))
    assert _best(greedy) == _best(beam)
    assert [h[0].score for h in greedy] == pytest.approx([h[0].score for h in beam], abs=1e-5)


def test_greedy_matches_step_by_step_argmax(tiny_model: Transformer) -> None:
    src, _ = random_batch(batch=1)
    found = search_batch(
        tiny_model, src, bos_id=BOS, eos_id=EOS, search=SearchConfig(max_len_a=0, max_len_b=6)
    )
    out = [[*found[0][0].tokens, EOS]]
    prefix = torch.tensor([[BOS]])
    for t in range(len(out[0])):
        logits = tiny_model(src, prefix)[:, -1]
        logits[:, [PAD, BOS]] = float("-inf")
        token = EOS if t == 5 else int(logits.argmax())
        assert out[0][t] == token
        prefix = torch.cat([prefix, torch.tensor([[token]])], dim=1)


@torch.no_grad()
def _sequence_logprob(model: Transformer, src: torch.Tensor, hyp: list[int]) -> float:
    """Teacher-forced log-probability of ``hyp`` followed by ``<eos>``."""
    tgt_in = torch.tensor([[BOS, *hyp]])
    lp = model(src, tgt_in).log_softmax(-1)[0]
    return float(sum(lp[t, tok] for t, tok in enumerate([*hyp, EOS])))


@pytest.mark.parametrize("beam_size", [1, 3])
def test_scores_are_the_log_probabilities_of_the_outputs(
    tiny_model: Transformer, beam_size: int
) -> None:
    """At alpha 0 every n-best entry's score is its teacher-forced log-probability."""
    src, _ = random_batch(batch=2)
    found = _search(tiny_model, src, beam_size=beam_size, nbest=beam_size, length_penalty=0.0)
    for b, hyps in enumerate(found):
        assert len(hyps) == beam_size
        for h in hyps:
            assert EOS not in h.tokens
            assert abs(_sequence_logprob(tiny_model, src[b : b + 1], h.tokens) - h.score) < 1e-4


def test_nbest_lists_are_ranked_distinct_and_start_with_the_1best(tiny_model: Transformer) -> None:
    src, _ = random_batch(batch=4)
    one = _search(tiny_model, src, beam_size=4, length_penalty=0.6)
    four = _search(tiny_model, src, beam_size=4, nbest=4, length_penalty=0.6)
    for single, hyps in zip(one, four):
        assert len(single) == 1 and hyps[0] == single[0]
        scores = [h.score for h in hyps]
        assert scores == sorted(scores, reverse=True)
        assert len({tuple(h.tokens) for h in hyps}) == len(hyps)


@pytest.mark.parametrize("beam_size", [1, 3])
def test_ensemble_of_a_model_with_itself_equals_the_model(
    tiny_model: Transformer, beam_size: int
) -> None:
    src, _ = random_batch(batch=5)
    twin = Transformer(tiny_config()).eval()
    twin.load_state_dict(tiny_model.state_dict())
    alone = _search(tiny_model, src, beam_size=beam_size, nbest=beam_size)
    pair = _search([tiny_model, twin], src, beam_size=beam_size, nbest=beam_size)
    assert [[h.tokens for h in x] for x in alone] == [[h.tokens for h in x] for x in pair]
    assert [[h.score for h in x] for x in alone] == [[h.score for h in x] for x in pair]


def test_ensemble_averages_the_models_log_probabilities(tiny_model: Transformer) -> None:
    """Greedy over two different models picks the argmax of their mean log-probabilities."""
    other = Transformer(tiny_config()).eval()  # another random initialisation
    src, _ = random_batch(batch=1)
    (hyp,) = _search([tiny_model, other], src, max_len_a=0, max_len_b=5)[0]
    prefix = torch.tensor([[BOS]])
    for token in [*hyp.tokens, EOS][:4]:
        with torch.no_grad():
            mean = (
                tiny_model(src, prefix)[:, -1].log_softmax(-1)
                + other(src, prefix)[:, -1].log_softmax(-1)
            ) / 2
        mean[:, [PAD, BOS]] = float("-inf")
        assert token == int(mean.argmax())
        prefix = torch.cat([prefix, torch.tensor([[token]])], dim=1)


def test_beam_finds_at_least_greedy_score(tiny_model: Transformer) -> None:
    src, _ = random_batch(batch=4)
    greedy = _best(_search(tiny_model, src))
    beam = _best(_search(tiny_model, src, beam_size=5, length_penalty=0.0))
    for b in range(4):
        g_score = _sequence_logprob(tiny_model, src[b : b + 1], greedy[b])
        h_score = _sequence_logprob(tiny_model, src[b : b + 1], beam[b])
        assert h_score >= g_score - 1e-4


def test_output_length_cap(tiny_model: Transformer) -> None:
    src, _ = random_batch(batch=3)
    src_len = (src != PAD).sum(1)
    for beam_size in (1, 3):
        search = SearchConfig(beam_size=beam_size, max_len_a=0.5, max_len_b=2)
        found = search_batch(tiny_model, src, bos_id=BOS, eos_id=EOS, search=search)
        for b in range(3):
            assert len(found[b][0].tokens) + 1 <= int(0.5 * src_len[b] + 2)  # <eos> counted


def test_outputs_hold_no_special_token(tiny_model: Transformer) -> None:
    src, _ = random_batch(batch=5)
    found = search_batch(tiny_model, src, bos_id=BOS, eos_id=EOS, search=SearchConfig(beam_size=2))
    for hyps in found:
        assert not {PAD, BOS, EOS} & set(hyps[0].tokens)


def test_search_config_rejects_bad_beam() -> None:
    with pytest.raises(ValueError, match="beam_size must be >= 1, got 0"):
        SearchConfig(beam_size=0)


def test_search_config_rejects_more_hypotheses_than_the_beam_keeps() -> None:
    with pytest.raises(ValueError, match="nbest=5 but a beam of 4 keeps 4 hypotheses"):
        SearchConfig(beam_size=4, nbest=5)


@pytest.mark.parametrize("norm", ["gnmt", "power"])
def test_scores_are_log_probabilities_divided_by_the_length_norm(
    tiny_model: Transformer, norm: str
) -> None:
    """Every n-best entry's score is its log-probability over ``length_penalty(|Y|, 1.0, norm)``
    (|Y| with ``<eos>``), and the list is ranked by that score."""
    src, _ = random_batch(batch=2)
    found = _search(tiny_model, src, beam_size=3, nbest=3, length_penalty=1.0, length_norm=norm)
    for b, hyps in enumerate(found):
        for h in hyps:
            divisor = length_penalty(len(h.tokens) + 1, 1.0, norm)
            log_prob = _sequence_logprob(tiny_model, src[b : b + 1], h.tokens)
            assert abs(log_prob / divisor - h.score) < 1e-4
        assert [h.score for h in hyps] == sorted((h.score for h in hyps), reverse=True)
    assert length_penalty(9, 1.0, "power") == 9 and length_penalty(7, 1.0, "gnmt") == 2.0


def test_search_config_rejects_an_unknown_length_norm() -> None:
    with pytest.raises(ValueError, match="length_norm='avg' is not one of gnmt, power"):
        SearchConfig(length_norm="avg")
