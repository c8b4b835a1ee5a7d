"""What every search shares: the models' decoding state over the key/value cache, the output
length caps, and the forced target prefixes.

The source is encoded once; then the decoder takes one token per step and, with the cache,
attends to the stored keys/values of the earlier steps instead of recomputing the whole prefix
(``use_cache=False`` recomputes it, for tests and benchmarks). Several models (an ensemble)
decode together: each keeps its own encoder output and cache, and a step's log-probabilities
are the mean of the models' log-probabilities.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from transformer_mt.inference.search.settings import SearchConfig, Steering, length_penalty
from transformer_mt.model.transformer import Transformer


def as_models(model: Transformer | Sequence[Transformer]) -> list[Transformer]:
    """One model or an ensemble as a list (an ensemble shares the vocabulary and pad id)."""
    models = [model] if isinstance(model, Transformer) else list(model)
    if not models:
        raise ValueError("no model to decode with; pass at least one checkpoint")
    for other in models[1:]:
        if other.config.tgt_vocab_size != models[0].config.tgt_vocab_size:
            raise ValueError(
                "ensembled models differ in target vocabulary size "
                f"({models[0].config.tgt_vocab_size} vs {other.config.tgt_vocab_size}); "
                "ensemble models trained with one tokenizer"
            )
        if other.pad_id != models[0].pad_id:
            raise ValueError("ensembled models differ in pad id; use one tokenizer")
    return models


class Decoding:
    """The incremental decoding state of every model over the sentences still searched."""

    def __init__(self, models: list[Transformer], src: Tensor, use_cache: bool) -> None:
        self.models = models
        self.states = []  # per model: [memory (n, S, d_model), src_mask (n, 1, 1, S), cache]
        for model in models:
            memory, src_mask = model.encode(src)
            self.states.append([memory, src_mask, model.new_cache() if use_cache else None])

    def log_probs(self, prefix: Tensor, step: int) -> Tensor:
        """Next-token log-probabilities ``(n, V)`` (float32) after ``prefix (n, step + 1)``."""
        out = []
        for model, (memory, src_mask, cache) in zip(self.models, self.states):
            if cache is not None:
                logits = model.decode(prefix[:, -1:], memory, src_mask, cache, offset=step)
            else:
                logits = model.decode(prefix, memory, src_mask)
            out.append(logits[:, -1].float().log_softmax(dim=-1))  # (n, V)
        return out[0] if len(out) == 1 else torch.stack(out).mean(dim=0)

    def select(self, rows: Tensor) -> None:
        """Keep (and order) the rows ``rows`` of every model's memory, mask and cache."""
        for state in self.states:
            state[0], state[1] = state[0][rows], state[1][rows]
            for layer in state[2] or ():
                for cache in layer:
                    cache.reorder(rows)

    def reorder_beams(self, rows: Tensor) -> None:
        """Beams moved within their sentence: only the self-attention caches follow.

        A sentence's K rows of cross-attention keys/values are identical, so they stay.
        """
        for _, _, cache in self.states:
            for self_cache, _ in cache or ():
                self_cache.reorder(rows)


def max_lengths(
    models: list[Transformer], src: Tensor, search: SearchConfig, steer: Steering
) -> Tensor:
    """:func:`output_caps` of the padded sources ``src (B, S)`` for these models, ``(B,)``."""
    src_len = (src != models[0].pad_id).sum(dim=1)  # (B,)
    return output_caps(src_len, search, steer, min(m.config.max_len for m in models))


def output_caps(src_len: Tensor, search: SearchConfig, steer: Steering, max_len: int) -> Tensor:
    """Per-sentence cap on generated tokens (eos included), ``(B,)``: the one rule of every
    engine, for sources of ``src_len`` tokens (``<eos>`` included) and a model of ``max_len``
    positions: ``max_len_a * src_len + max_len_b`` (fairseq's convention).

    A forced prefix or constraint phrases get room on top of the cap: the prefix plus
    ``max_len_b`` tokens, the constraints' tokens added to it.
    """
    # float32 arithmetic, so that every engine floors alike at the edges
    limit = (search.max_len_a * src_len.float() + search.max_len_b).floor().long().clamp(min=1)
    if steer.prefixes is not None:
        needed = torch.tensor([len(p) + search.max_len_b for p in steer.prefixes])
        limit = torch.maximum(limit, needed.to(limit.device))
    if steer.constraints is not None:
        extra = torch.tensor([sum(map(len, c)) for c in steer.constraints])
        limit = limit + extra.to(limit.device)
    # The decoder input is bos + all generated tokens but the last: max_len positions.
    return limit.clamp(max=max_len)


def ban_specials(lprobs: Tensor, pad_id: int, bos_id: int) -> None:
    """Never generate padding or a second ``<bos>`` (in place)."""
    lprobs[:, pad_id] = -math.inf
    lprobs[:, bos_id] = -math.inf


class PrefixForcing:
    """The forced target prefix of each sentence: at step ``t`` a sentence with a prefix longer
    than ``t`` can only take its ``t``-th token, at no cost (scores cover the continuation)."""

    def __init__(self, prefixes: Sequence[Sequence[int]] | None, B: int, device: Any) -> None:
        self.lengths = [len(p) for p in prefixes] if prefixes is not None else [0] * B
        self.tokens = torch.full((B, max(self.lengths, default=0)), -1, dtype=torch.long)
        for b, p in enumerate(prefixes or ()):
            self.tokens[b, : len(p)] = torch.as_tensor(list(p), dtype=torch.long)
        self.tokens = self.tokens.to(device)

    def apply(self, lprobs: Tensor, sentences: Tensor, step: int) -> None:
        """Force the rows of ``lprobs`` whose sentence (``sentences``) is still in its prefix."""
        if step >= self.tokens.size(1):
            return
        token = self.tokens[sentences, step]  # (rows,)
        rows = (token >= 0).nonzero().squeeze(1)
        if rows.numel():
            lprobs[rows] = -math.inf
            lprobs[rows, token[rows]] = 0.0


def divisor(length: int, search: SearchConfig) -> float:
    """The length normalisation of a hypothesis of ``length`` tokens (``<eos>`` counted)."""
    return float(length_penalty(length, search.length_penalty, search.length_norm))
