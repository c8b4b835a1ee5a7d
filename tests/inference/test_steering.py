"""Steerable search: sampling, forced prefixes and lexical constraints in inference/search/."""

from __future__ import annotations

import math

import pytest
import torch

from transformer_mt.errors import SettingError
from transformer_mt.inference.search import SearchConfig, Steering, search_batch
from transformer_mt.inference.search.constraints import ConstraintState, Extension, allocate
from transformer_mt.model.transformer import Transformer

from conftest import BOS, EOS, random_batch


def _run(model, src, steer=None, **options) -> list:
    return search_batch(
        model, src, bos_id=BOS, eos_id=EOS, search=SearchConfig(**options), steer=steer
    )


def _tokens(nbest_lists) -> list[list[list[int]]]:
    return [[h.tokens for h in hyps] for hyps in nbest_lists]


# ---------------------------------------------------------------------------------- sampling


def test_seeded_sampling_repeats_and_does_not_depend_on_the_batch(tiny_model: Transformer):
    src, _ = random_batch(batch=6)
    options = dict(sampling_topk=0, temperature=1.5, seed=3, nbest=3, max_len_b=12)
    batch = _tokens(_run(tiny_model, src, **options))
    assert batch == _tokens(_run(tiny_model, src, **options))
    # Each sentence alone (no padding beside it) draws the same samples.
    pad = tiny_model.pad_id
    for i in range(src.size(0)):
        row = src[i : i + 1, : int((src[i] != pad).sum())]
        assert _tokens(_run(tiny_model, row, **options)) == [batch[i]]
    other = _tokens(_run(tiny_model, src, **{**options, "seed": 4}))
    assert other != batch
    # An untrained model's flat distribution gives different samples of one sentence.
    assert any(len({tuple(s) for s in samples}) > 1 for samples in batch)


def test_top_k_one_and_a_tiny_top_p_are_greedy(tiny_model: Transformer) -> None:
    src, _ = random_batch(batch=4)
    greedy = _tokens(_run(tiny_model, src))
    assert _tokens(_run(tiny_model, src, sampling_topk=1, seed=0)) == greedy
    assert _tokens(_run(tiny_model, src, sampling_topp=1e-6, seed=0)) == greedy


def test_top_k_samples_only_the_k_most_likely_tokens(tiny_model: Transformer) -> None:
    """With top-k 2, every sampled first token is one of the two most likely first tokens."""
    src, _ = random_batch(batch=3)
    memory, mask = tiny_model.encode(src)
    first = tiny_model.decode(torch.full((3, 1), BOS), memory, mask)[:, -1]
    first[:, [tiny_model.pad_id, BOS]] = -math.inf
    top2 = first.topk(2, dim=-1).indices.tolist()
    found = _run(tiny_model, src, sampling_topk=2, seed=1, nbest=8, max_len_b=3)
    for allowed, samples in zip(top2, found):
        assert {h.tokens[0] if h.tokens else EOS for h in samples} <= set(allowed)


@pytest.mark.parametrize(
    "options, words",
    [
        (dict(sampling_topk=5, beam_size=4), "beam_size"),
        (dict(sampling_topp=0.0), "sampling_topp"),
        (dict(sampling_topp=1.5), "sampling_topp"),
        (dict(sampling_topp=float("nan")), "finite"),
        (dict(sampling_topk=-1), "sampling_topk"),
        (dict(sampling_topk=0, temperature=0.0), "temperature"),
        (dict(temperature=2.0), "only applies to sampling"),
        (dict(seed=0), "only applies to sampling"),
        (dict(length_penalty=float("nan")), "finite"),
        (dict(max_len_a=float("inf")), "finite"),
    ],
)
def test_bad_sampling_options_are_refused_naming_the_setting(options, words) -> None:
    with pytest.raises(SettingError, match=words):
        SearchConfig(**options)


def test_asking_for_sampling_replaces_a_stored_beam() -> None:
    stored = {"beam_size": 5, "length_penalty": 1.0}
    search = SearchConfig.from_stored(stored, sampling_topk=10, nbest=3)
    assert (search.beam_size, search.nbest, search.sampling) == (1, 3, True)
    with pytest.raises(SettingError, match="beam_size"):
        SearchConfig.from_stored(stored, sampling_topk=10, beam_size=5)


# ---------------------------------------------------------------------------------- prefixes


@pytest.mark.parametrize("beam_size", [1, 4])
def test_outputs_start_with_their_forced_prefix(tiny_model: Transformer, beam_size: int):
    src, _ = random_batch(batch=4)
    prefixes = [[7, 8, 9], [], [30], [11, 11, 11, 11, 11]]
    found = _run(tiny_model, src, Steering(prefixes=prefixes), beam_size=beam_size, nbest=beam_size)
    for prefix, hyps in zip(prefixes, found):
        for h in hyps:
            assert h.tokens[: len(prefix)] == prefix
    # No prefix: as without steering.
    plain = _run(tiny_model, src, beam_size=beam_size, nbest=beam_size)
    assert _tokens(found)[1] == _tokens(plain)[1]


def test_a_prefix_costs_nothing_and_greedy_continues_as_the_plain_search(
    tiny_model: Transformer,
) -> None:
    """Forcing the first greedy tokens of a plain search gives the same output, and a score
    that leaves out the forced tokens' log-probabilities."""
    src, _ = random_batch(batch=3)
    plain = _run(tiny_model, src, length_penalty=0.0)
    prefixes = [h[0].tokens[:2] for h in plain]
    forced = _run(tiny_model, src, Steering(prefixes=prefixes), length_penalty=0.0)
    assert _tokens(forced) == _tokens(plain)
    for p, f in zip(plain, forced):
        if len(p[0].tokens) > 2:
            assert f[0].score > p[0].score  # the forced tokens' log-probabilities are left out


# ------------------------------------------------------------------------------- constraints


def _contains(tokens: list[int], phrase: list[int]) -> bool:
    return any(tokens[i : i + len(phrase)] == phrase for i in range(len(tokens)))


def test_every_hypothesis_contains_every_constraint(tiny_model: Transformer) -> None:
    src, _ = random_batch(batch=5)
    constraints = [[[20, 21]], [[5], [33, 34, 35]], [], [[9, 9]], [[12], [13]]]
    found = _run(tiny_model, src, Steering(constraints=constraints), beam_size=4, nbest=4)
    for phrases, hyps in zip(constraints, found):
        assert len(hyps) == 4
        for h in hyps:
            assert all(_contains(h.tokens, p) for p in phrases), (phrases, h.tokens)


def test_constraints_with_sampling_are_refused(tiny_model: Transformer) -> None:
    src, _ = random_batch(batch=2)
    with pytest.raises(SettingError, match="constraints need a beam search"):
        _run(tiny_model, src, Steering(constraints=[[[5]], []]), sampling_topk=3)


def test_constraints_with_a_prefix_hold_both(tiny_model: Transformer) -> None:
    src, _ = random_batch(batch=2)
    steer = Steering(prefixes=[[6, 7], [8]], constraints=[[[25, 26]], [[27]]])
    for prefix, phrases, hyps in zip(
        steer.prefixes, steer.constraints, _run(tiny_model, src, steer, beam_size=3)
    ):
        assert hyps[0].tokens[: len(prefix)] == prefix
        assert all(_contains(hyps[0].tokens, p) for p in phrases)


def test_no_constraints_is_the_plain_beam(tiny_model: Transformer) -> None:
    src, _ = random_batch(batch=4)
    plain = _run(tiny_model, src, beam_size=3, nbest=3)
    empty = _run(tiny_model, src, Steering(constraints=[[]] * 4), beam_size=3, nbest=3)
    assert [h[0].tokens for h in empty] == [h[0].tokens for h in plain]


def test_constraint_state_follows_phrases_in_any_order() -> None:
    state = ConstraintState(((5, 6), (7,)))
    assert state.wanted() == {5, 7}
    state = state.advance(7)
    assert state.met == {1} and state.progress == 1 and not state.finished
    state = state.advance(5)
    assert state.current == (0, 1) and state.wanted() == {6}
    broken = state.advance(9)  # breaks off the phrase: it can start again
    assert broken.current is None and broken.progress == 1
    done = state.advance(6)
    assert done.finished and done.progress == 3


def test_allocation_spreads_the_beam_over_progress_banks() -> None:
    phrases = ((5, 6),)
    none, half = ConstraintState(phrases), ConstraintState(phrases).advance(5)
    cands = [Extension(-1.0 - i, i, 10 + i, none) for i in range(6)]
    cands.append(Extension(-20.0, 0, 5, half))
    kept = allocate(cands, 4)
    assert len(kept) == 4 and any(c.state.progress == 1 for c in kept)
    # A bank that cannot fill its share leaves the slots to the others.
    assert len(allocate(cands[:1] + cands[-1:], 4)) == 2
