"""Batched greedy and beam search over the decoder's key/value cache.

Both searches encode the source once, then feed the decoder one token per step: with the
cache, each step attends to the stored keys/values of the earlier steps instead of recomputing
the whole prefix (``use_cache=False`` recomputes it, for tests and benchmarks). Sentences that
have finished are dropped from the batch, so the work per step shrinks as the batch ends.

The output length of each sentence is capped at ``max_len_a * src_len + max_len_b`` tokens
(fairseq's convention; ``src_len`` counts the non-pad source tokens) and by the model's
positional ``max_len``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from transformer_mt.model.kv_cache import KVCache
from transformer_mt.model.transformer import Transformer


@dataclass
class SearchConfig:
    """Decoding options shared by greedy and beam search."""

    beam_size: int = 1
    length_penalty: float = 0.6
    max_len_a: float = 1.2
    max_len_b: int = 10
    use_cache: bool = True

    def __post_init__(self) -> None:
        if self.beam_size < 1:
            raise ValueError(
                f"beam_size must be >= 1, got {self.beam_size}; set decoding.beam_size=1 (greedy) "
                "or more"
            )
        if self.max_len_a < 0 or self.max_len_a * 1 + self.max_len_b < 1:
            raise ValueError(
                f"max_len_a={self.max_len_a}, max_len_b={self.max_len_b} allow no output token; "
                "use e.g. max_len_a=1.2 max_len_b=10"
            )


def _max_lengths(model: Transformer, src: Tensor, a: float, b: int) -> Tensor:
    """Per-sentence cap on generated tokens (eos included), ``(B,)``."""
    src_len = (src != model.pad_id).sum(dim=1)  # (B,)
    limit = (a * src_len.float() + b).floor().long().clamp(min=1)
    # The decoder input is bos + all generated tokens but the last: max_len positions.
    return limit.clamp(max=model.config.max_len)


def _select_cache(cache: list[tuple[KVCache, KVCache]], index: Tensor) -> None:
    for self_cache, cross_cache in cache:
        self_cache.reorder(index)
        cross_cache.reorder(index)


@torch.no_grad()
def greedy_search(
    model: Transformer,
    src: Tensor,
    bos_id: int,
    eos_id: int,
    max_len_a: float = 1.2,
    max_len_b: int = 10,
    use_cache: bool = True,
) -> Tensor:
    """Pick the most likely token at every step.

    Args:
        src: source token ids ``(B, S)`` padded with ``model.pad_id``.

    Returns:
        Generated ids ``(B, L)`` (no bos), each row ending with ``eos_id`` and then padding.
    """
    B, device, pad = src.size(0), src.device, model.pad_id
    memory, src_mask = model.encode(src)  # (B, S, d_model), (B, 1, 1, S)
    max_lens = _max_lengths(model, src, max_len_a, max_len_b)  # (B,)
    steps = int(max_lens.max())
    out = torch.full((B, steps), pad, dtype=torch.long, device=device)
    alive = torch.arange(B, device=device)  # rows of `out` still being decoded
    prefix = torch.full((B, 1), bos_id, dtype=torch.long, device=device)  # (B_alive, t + 1)
    cache = model.new_cache() if use_cache else None
    for step in range(steps):
        if cache is not None:
            logits = model.decode(prefix[:, -1:], memory, src_mask, cache, offset=step)
        else:
            logits = model.decode(prefix, memory, src_mask)
        logits = logits[:, -1]  # (B_alive, V)
        logits[:, pad] = -math.inf  # never generate padding or a second bos
        logits[:, bos_id] = -math.inf
        next_token = logits.argmax(dim=-1)  # (B_alive,)
        # A sentence at its length cap ends here.
        next_token = torch.where(step + 1 >= max_lens[alive], eos_id, next_token)
        out[alive, step] = next_token
        finished = next_token == eos_id
        if bool(finished.all()):
            return out[:, : step + 1]
        prefix = torch.cat([prefix, next_token[:, None]], dim=1)  # (B_alive, t + 2)
        if bool(finished.any()):
            keep = (~finished).nonzero().squeeze(1)
            alive, prefix = alive[keep], prefix[keep]
            memory, src_mask = memory[keep], src_mask[keep]
            if cache is not None:
                _select_cache(cache, keep)
    return out


def length_penalty(length: Tensor | int, alpha: float) -> Tensor | float:
    """GNMT's length penalty ((5 + |Y|) / 6) ** alpha (Wu et al., 2016, eq. 14).

    Beam scores are divided by it, so alpha > 0 favours longer outputs; alpha = 0 ranks by raw
    log-probability. The paper used alpha = 0.6 with beam size 4 (section 6.1).
    """
    return ((5.0 + length) / 6.0) ** alpha


@torch.no_grad()
def beam_search(
    model: Transformer,
    src: Tensor,
    bos_id: int,
    eos_id: int,
    beam_size: int = 4,
    alpha: float = 0.6,
    max_len_a: float = 1.2,
    max_len_b: int = 10,
    use_cache: bool = True,
) -> tuple[Tensor, Tensor]:
    """Keep the ``beam_size`` best prefixes per sentence; return the best finished hypothesis.

    Each step scores all ``K x V`` extensions of the ``K`` live prefixes and takes the best
    ``2K`` of them (fairseq's trick): hypotheses ending in eos among the first ``K`` are set
    aside as finished, and the best ``K`` that do not end in eos continue, so the beam stays
    full. A sentence stops when it has ``K`` finished hypotheses (early stopping); the answer
    is the finished hypothesis with the best length-normalised score (:func:`length_penalty`).
    With ``beam_size=1`` this is exactly greedy search.

    Returns:
        ``(tokens (B, L), scores (B,))``: ids without bos ending with eos then padding, and
        the length-normalised log-probability of each returned hypothesis.
    """
    if beam_size < 1:
        raise ValueError(f"beam_size must be >= 1, got {beam_size}")
    K, B, device, pad = beam_size, src.size(0), src.device, model.pad_id
    memory, src_mask = model.encode(src)  # (B, S, d_model), (B, 1, 1, S)
    max_lens = _max_lengths(model, src, max_len_a, max_len_b)  # (B,)
    steps = int(max_lens.max())

    # Every tensor below is laid out sentence-major: row b * K + k is beam k of sentence b.
    expand = torch.arange(B, device=device).repeat_interleave(K)  # (B * K,)
    memory, src_mask = memory[expand], src_mask[expand]  # (B*K, S, d_model), (B*K, 1, 1, S)
    prefix = torch.full((B * K, 1), bos_id, dtype=torch.long, device=device)
    # Only beam 0 is live at the start, so the first step does not pick K copies of one token.
    scores = torch.full((B, K), -math.inf, device=device)
    scores[:, 0] = 0.0
    alive = torch.arange(B, device=device)  # original index of each sentence still searched
    finished: list[list[tuple[float, list[int]]]] = [[] for _ in range(B)]
    cache = model.new_cache() if use_cache else None

    for step in range(steps):
        n = alive.numel()
        if cache is not None:
            logits = model.decode(prefix[:, -1:], memory, src_mask, cache, offset=step)
        else:
            logits = model.decode(prefix, memory, src_mask)
        lprobs = logits[:, -1].float().log_softmax(dim=-1)  # (n*K, V)
        V = lprobs.size(-1)
        lprobs[:, pad] = -math.inf
        lprobs[:, bos_id] = -math.inf
        at_cap = (step + 1 >= max_lens[alive]).repeat_interleave(K)  # (n*K,)
        if bool(at_cap.any()):  # a sentence at its length cap may only end
            eos_col = lprobs[at_cap, eos_id].clone()
            lprobs[at_cap] = -math.inf
            lprobs[at_cap, eos_id] = eos_col

        candidates = (scores.view(n * K, 1) + lprobs).view(n, K * V)  # (n, K * V)
        top_scores, top_index = candidates.topk(2 * K, dim=1)  # (n, 2K)
        top_beam, top_token = top_index // V, top_index % V  # (n, 2K)

        # Set aside hypotheses that end here (only among the K best, as fairseq does).
        ends = (top_token[:, :K] == eos_id) & torch.isfinite(top_scores[:, :K])  # (n, K)
        length = step + 1  # generated tokens, eos included
        for i, j in ends.nonzero().tolist():
            b = int(alive[i])
            if len(finished[b]) < K:
                row = i * K + int(top_beam[i, j])
                hyp = [*prefix[row, 1:].tolist(), eos_id]
                finished[b].append((float(top_scores[i, j]) / length_penalty(length, alpha), hyp))

        # Continue with the best K candidates that do not end.
        live_scores = top_scores.masked_fill(top_token == eos_id, -math.inf)  # (n, 2K)
        scores, pick = live_scores.topk(K, dim=1)  # (n, K)
        beam = top_beam.gather(1, pick)  # (n, K)
        token = top_token.gather(1, pick)  # (n, K)
        rows = (torch.arange(n, device=device)[:, None] * K + beam).view(-1)  # (n*K,)
        prefix = torch.cat([prefix[rows], token.view(-1, 1)], dim=1)  # (n*K, t + 2)
        if cache is not None:
            # Beams move only within their sentence, whose K rows of cross-attention K/V are
            # identical: only the self-attention caches need reordering here.
            for self_cache, _ in cache:
                self_cache.reorder(rows)

        # A sentence is done with K finished hypotheses or at its length cap.
        done = torch.tensor([len(finished[b]) >= K for b in alive.tolist()], device=device)
        done |= step + 1 >= max_lens[alive]
        if bool(done.all()):
            break
        if bool(done.any()):
            keep = (~done).nonzero().squeeze(1)  # (n',)
            keep_rows = (keep[:, None] * K + torch.arange(K, device=device)).view(-1)  # (n'*K,)
            alive, scores = alive[keep], scores[keep]
            prefix = prefix[keep_rows]
            memory, src_mask = memory[keep_rows], src_mask[keep_rows]
            if cache is not None:
                _select_cache(cache, keep_rows)

    # Sentences that hit the step limit without K finished hypotheses: add their live beams.
    for i, b in enumerate(alive.tolist()):
        if len(finished[b]) < K:
            for k in range(K):
                s = float(scores[i, k])
                if math.isfinite(s):
                    hyp = prefix[i * K + k, 1:].tolist()
                    finished[b].append((s / length_penalty(len(hyp), alpha), hyp))

    best = [max(hyps, key=lambda h: h[0]) for hyps in finished]
    width = max(len(h) for _, h in best)
    tokens = torch.full((B, width), pad, dtype=torch.long, device=device)
    for b, (_, hyp) in enumerate(best):
        tokens[b, : len(hyp)] = torch.tensor(hyp, dtype=torch.long, device=device)
    return tokens, torch.tensor([s for s, _ in best], device=device)


def generate(
    model: Transformer, src: Tensor, bos_id: int, eos_id: int, config: SearchConfig
) -> Tensor:
    """Decode ``src (B, S)`` with greedy (beam_size 1) or beam search; ids ``(B, L)``."""
    if config.beam_size == 1:
        return greedy_search(
            model, src, bos_id, eos_id, config.max_len_a, config.max_len_b, config.use_cache
        )
    tokens, _ = beam_search(
        model,
        src,
        bos_id,
        eos_id,
        config.beam_size,
        config.length_penalty,
        config.max_len_a,
        config.max_len_b,
        config.use_cache,
    )
    return tokens
