"""Batched greedy and beam search over the decoder's key/value cache, for one model or several.

Both searches encode the source once, then feed the decoder one token per step: with the
cache, each step attends to the stored keys/values of the earlier steps instead of recomputing
the whole prefix (``use_cache=False`` recomputes it, for tests and benchmarks). Sentences that
have finished are dropped from the batch, so the work per step shrinks as the batch ends.

Several models (an ensemble) decode together: each keeps its own encoder output and cache, and
the step's log-probabilities are the mean of the models' log-probabilities.

The output length of each sentence is capped at ``max_len_a * src_len + max_len_b`` tokens
(fairseq's convention; ``src_len`` counts the non-pad source tokens) and by the models'
positional ``max_len``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

import torch
from torch import Tensor

from transformer_mt.errors import SettingError
from transformer_mt.model.kv_cache import KVCache
from transformer_mt.model.transformer import Transformer

#: How beam scores are normalised by length (:func:`length_penalty`).
LENGTH_NORMS = ("gnmt", "power")


# Hashable by value (it is never changed after construction): the service gives requests
# with equal searches one engine call.
@dataclass(unsafe_hash=True)
class SearchConfig:
    """Decoding options shared by greedy and beam search.

    Args:
        beam_size: Hypotheses kept per sentence (1 = greedy search).
        length_penalty: The exponent alpha of the length normalisation
            (:func:`length_penalty`); 0 ranks by log-probability.
        length_norm: ``gnmt`` divides scores by ``((5 + |Y|) / 6) ** alpha`` (Wu et al.),
            ``power`` by ``|Y| ** alpha`` (fairseq, Hugging Face ``generate``, CTranslate2).
        max_len_a, max_len_b: Output cap ``max_len_a * source length + max_len_b`` tokens.
        use_cache: Decode with the key/value cache (``False`` recomputes every prefix).
        nbest: Hypotheses returned per sentence, best first (at most ``beam_size``).
    """

    beam_size: int = 1
    length_penalty: float = 0.6
    length_norm: str = "gnmt"
    max_len_a: float = 1.2
    max_len_b: int = 10
    use_cache: bool = True
    nbest: int = 1

    def __post_init__(self) -> None:
        if self.beam_size < 1:
            raise SettingError(
                f"beam_size must be >= 1, got {self.beam_size}", [("beam_size", 1)],
                tail="(greedy) or more",
            )  # fmt: skip
        if self.max_len_a < 0 or self.max_len_a * 1 + self.max_len_b < 1:
            raise SettingError(
                f"max_len_a {self.max_len_a} with max_len_b {self.max_len_b} allow no output "
                "token", [("max_len_a", 1.2), ("max_len_b", 10)], lead="use e.g.",
            )  # fmt: skip
        if self.length_norm not in LENGTH_NORMS:
            raise ValueError(
                f"length_norm={self.length_norm!r} is not one of {', '.join(LENGTH_NORMS)}; use "
                "gnmt ((5 + |Y|) / 6) ** alpha) or power (|Y| ** alpha)"
            )
        if not 1 <= self.nbest <= self.beam_size:
            raise ValueError(
                f"nbest={self.nbest} but a beam of {self.beam_size} keeps {self.beam_size} "
                f"hypotheses; ask for 1 to {self.beam_size}, or raise the beam size to "
                f"{max(self.nbest, 1)}"
            )

    @classmethod
    def from_stored(cls, decoding: Mapping[str, Any] | None, **overrides: Any) -> SearchConfig:
        """The search a checkpoint stores (``decoding``; unknown keys ignored) with the
        non-``None`` ``overrides`` on top: the one way every command builds its search."""
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in (decoding or {}).items() if k in known}
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)


@dataclass(frozen=True)
class Hypothesis:
    """One output of a search.

    Attributes:
        tokens: Output ids without ``<bos>`` and ``<eos>``.
        score: The search's ranking score: the sum of the token log-probabilities
            (``<eos>`` included) divided by ``length_penalty(length, alpha, norm)``, where
            ``length`` counts ``<eos>``; the plain log-probability at alpha 0.
    """

    tokens: list[int]
    score: float


def length_penalty(length: Tensor | int, alpha: float, norm: str = "gnmt") -> Tensor | float:
    """The divisor of a hypothesis' summed log-probability: ``gnmt`` or ``power``.

    ``gnmt`` is GNMT's ((5 + |Y|) / 6) ** alpha (Wu et al., 2016, eq. 14), ``power`` the plain
    |Y| ** alpha of fairseq, Hugging Face ``generate`` and CTranslate2. Beam scores are divided
    by it, so alpha > 0 favours longer outputs; alpha = 0 ranks by raw log-probability. The paper
    used alpha = 0.6 with beam size 4 (section 6.1).
    """
    if norm == "power":
        return length**alpha
    return ((5.0 + length) / 6.0) ** alpha


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


class _Decoding:
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
            for cache in state[2] or ():
                _select_cache(cache, rows)

    def reorder_beams(self, rows: Tensor) -> None:
        """Beams moved within their sentence: only the self-attention caches follow.

        A sentence's K rows of cross-attention keys/values are identical, so they stay.
        """
        for _, _, cache in self.states:
            for self_cache, _ in cache or ():
                self_cache.reorder(rows)


def _select_cache(layer: tuple[KVCache, KVCache], index: Tensor) -> None:
    for cache in layer:
        cache.reorder(index)


def _max_lengths(models: list[Transformer], src: Tensor, a: float, b: int) -> Tensor:
    """Per-sentence cap on generated tokens (eos included), ``(B,)``."""
    src_len = (src != models[0].pad_id).sum(dim=1)  # (B,)
    limit = (a * src_len.float() + b).floor().long().clamp(min=1)
    # The decoder input is bos + all generated tokens but the last: max_len positions.
    return limit.clamp(max=min(m.config.max_len for m in models))


def _ban_specials(lprobs: Tensor, pad_id: int, bos_id: int) -> None:
    """Never generate padding or a second ``<bos>`` (in place)."""
    lprobs[:, pad_id] = -math.inf
    lprobs[:, bos_id] = -math.inf


@torch.no_grad()
def greedy_search(
    model: Transformer | Sequence[Transformer],
    src: Tensor,
    *,
    bos_id: int,
    eos_id: int,
    search: SearchConfig,
) -> list[list[Hypothesis]]:
    """Pick the most likely token at every step (``search.beam_size`` is not read).

    Args:
        model: A model, or several whose log-probabilities are averaged (an ensemble).
        src: Source token ids ``(B, S)`` padded with the models' pad id.

    Returns:
        One single-hypothesis list per sentence.
    """
    models = as_models(model)
    B, device = src.size(0), src.device
    decoding = _Decoding(models, src, search.use_cache)
    max_lens = _max_lengths(models, src, search.max_len_a, search.max_len_b)  # (B,)
    steps = int(max_lens.max())
    out = torch.full((B, steps), eos_id, dtype=torch.long, device=device)
    log_prob = torch.zeros(B, device=device)  # (B,)
    alive = torch.arange(B, device=device)  # rows of `out` still being decoded
    prefix = torch.full((B, 1), bos_id, dtype=torch.long, device=device)  # (B_alive, t + 1)
    for step in range(steps):
        lprobs = decoding.log_probs(prefix, step)  # (B_alive, V)
        _ban_specials(lprobs, models[0].pad_id, bos_id)
        next_token = lprobs.argmax(dim=-1)  # (B_alive,)
        # A sentence at its length cap ends here.
        next_token = torch.where(step + 1 >= max_lens[alive], eos_id, next_token)
        out[alive, step] = next_token
        log_prob[alive] += lprobs.gather(1, next_token[:, None]).squeeze(1)
        finished = next_token == eos_id
        if bool(finished.all()):
            break
        prefix = torch.cat([prefix, next_token[:, None]], dim=1)  # (B_alive, t + 2)
        if bool(finished.any()):
            keep = (~finished).nonzero().squeeze(1)
            alive, prefix = alive[keep], prefix[keep]
            decoding.select(keep)
    return [
        [_hypothesis(row, lp, search, eos_id)] for row, lp in zip(out.tolist(), log_prob.tolist())
    ]


def _hypothesis(row: list[int], log_prob: float, search: SearchConfig, eos_id: int) -> Hypothesis:
    """A greedy output row (ended by its first ``<eos>``) as a :class:`Hypothesis`."""
    tokens = row[: row.index(eos_id)]
    return Hypothesis(tokens, log_prob / _divisor(len(tokens) + 1, search))


def _divisor(length: int, search: SearchConfig) -> float:
    return length_penalty(length, search.length_penalty, search.length_norm)


class _Beam:
    """The state of a beam search: K live prefixes per sentence and the finished hypotheses.

    Every tensor is laid out sentence-major: row ``i * K + k`` is beam ``k`` of live sentence
    ``i``, whose original index is ``alive[i]``.
    """

    def __init__(self, src: Tensor, bos_id: int, K: int) -> None:
        B, device = src.size(0), src.device
        self.K, self.device = K, device
        self.prefix = torch.full((B * K, 1), bos_id, dtype=torch.long, device=device)
        # Only beam 0 is live at the start, so the first step does not pick K copies of one token.
        self.scores = torch.full((B, K), -math.inf, device=device)  # summed log-probabilities
        self.scores[:, 0] = 0.0
        self.alive = torch.arange(B, device=device)
        #: per sentence: (ranking score, ids with eos)
        self.finished: list[list[tuple[float, list[int]]]] = [[] for _ in range(B)]

    def extend(self, lprobs: Tensor, eos_id: int, search: SearchConfig) -> Tensor:
        """Score all ``K x V`` extensions; set finished ones aside; keep the best K live.

        Takes the best ``2K`` candidates (fairseq's trick): those ending in eos among the first
        K are finished, and the best K that do not end continue, so the beam stays full.

        Returns:
            The rows ``(n*K,)`` of the previous prefixes that the new beams extend.
        """
        n, K, V = self.alive.numel(), self.K, lprobs.size(-1)
        candidates = (self.scores.view(n * K, 1) + lprobs).view(n, K * V)  # (n, K * V)
        top_scores, top_index = candidates.topk(2 * K, dim=1)  # (n, 2K)
        top_beam, top_token = top_index // V, top_index % V  # (n, 2K)
        ends = (top_token[:, :K] == eos_id) & torch.isfinite(top_scores[:, :K])  # (n, K)
        length = self.prefix.size(1)  # generated tokens with this step's, eos included
        for i, j in ends.nonzero().tolist():
            b = int(self.alive[i])
            if len(self.finished[b]) < K:
                hyp = [*self.prefix[i * K + int(top_beam[i, j]), 1:].tolist(), eos_id]
                score = float(top_scores[i, j]) / _divisor(length, search)
                self.finished[b].append((score, hyp))
        live_scores = top_scores.masked_fill(top_token == eos_id, -math.inf)  # (n, 2K)
        self.scores, pick = live_scores.topk(K, dim=1)  # (n, K)
        beam, token = top_beam.gather(1, pick), top_token.gather(1, pick)  # (n, K)
        rows = (torch.arange(n, device=self.device)[:, None] * K + beam).view(-1)  # (n*K,)
        self.prefix = torch.cat([self.prefix[rows], token.view(-1, 1)], dim=1)  # (n*K, t + 2)
        return rows

    def done(self, at_cap: Tensor) -> Tensor:
        """Live sentences with K finished hypotheses or at their length cap, ``(n,)``."""
        full = [len(self.finished[b]) >= self.K for b in self.alive.tolist()]
        return torch.tensor(full, device=self.device) | at_cap

    def keep(self, keep: Tensor) -> Tensor:
        """Drop the sentences not in ``keep (n',)``; return their beams' rows ``(n'*K,)``."""
        K = self.K
        rows = (keep[:, None] * K + torch.arange(K, device=self.device)).view(-1)  # (n'*K,)
        self.alive, self.scores, self.prefix = (
            self.alive[keep],
            self.scores[keep],
            self.prefix[rows],
        )
        return rows

    def results(self, search: SearchConfig, eos_id: int) -> list[list[Hypothesis]]:
        """The ``nbest`` best hypotheses per sentence, best first.

        Sentences that stopped without K finished hypotheses add their live beams.
        """
        for i, b in enumerate(self.alive.tolist()):
            if len(self.finished[b]) < self.K:
                for k in range(self.K):
                    total = float(self.scores[i, k])
                    if math.isfinite(total):
                        hyp = self.prefix[i * self.K + k, 1:].tolist()
                        self.finished[b].append((total / _divisor(len(hyp), search), hyp))
        out = []
        for hyps in self.finished:
            # sorted() is stable: ties keep their order.
            ranked = sorted(hyps, key=lambda h: -h[0])[: search.nbest]
            out.append([Hypothesis(_strip_eos(h, eos_id), s) for s, h in ranked])
        return out


def _strip_eos(seq: list[int], eos_id: int) -> list[int]:
    return seq[:-1] if seq and seq[-1] == eos_id else seq


def _cap_to_eos(lprobs: Tensor, at_cap: Tensor, eos_id: int) -> None:
    """Rows at their length cap may only end (in place)."""
    if bool(at_cap.any()):
        eos_col = lprobs[at_cap, eos_id].clone()
        lprobs[at_cap] = -math.inf
        lprobs[at_cap, eos_id] = eos_col


@torch.no_grad()
def beam_search(
    model: Transformer | Sequence[Transformer],
    src: Tensor,
    *,
    bos_id: int,
    eos_id: int,
    search: SearchConfig,
) -> list[list[Hypothesis]]:
    """Keep the ``search.beam_size`` best prefixes per sentence; return the best finished ones.

    A sentence stops when it has K finished hypotheses (early stopping); they are ranked by the
    length-normalised score (:func:`length_penalty`) and the first ``search.nbest`` returned.
    With ``beam_size=1`` this is exactly greedy search.

    Args:
        model: A model, or several whose log-probabilities are averaged (an ensemble).
        src: Source token ids ``(B, S)`` padded with the models' pad id.
    """
    models, K = as_models(model), search.beam_size
    decoding = _Decoding(models, src, search.use_cache)
    # Sentence-major copies: row b * K + k is beam k of sentence b.
    decoding.select(torch.arange(src.size(0), device=src.device).repeat_interleave(K))
    max_lens = _max_lengths(models, src, search.max_len_a, search.max_len_b)  # (B,)
    beam = _Beam(src, bos_id, K)
    for step in range(int(max_lens.max())):
        lprobs = decoding.log_probs(beam.prefix, step)  # (n*K, V)
        _ban_specials(lprobs, models[0].pad_id, bos_id)
        at_cap = step + 1 >= max_lens[beam.alive]  # (n,)
        _cap_to_eos(lprobs, at_cap.repeat_interleave(K), eos_id)
        decoding.reorder_beams(beam.extend(lprobs, eos_id, search))
        done = beam.done(at_cap)
        if bool(done.all()):
            break
        if bool(done.any()):
            decoding.select(beam.keep((~done).nonzero().squeeze(1)))
    return beam.results(search, eos_id)


def search_batch(
    model: Transformer | Sequence[Transformer],
    src: Tensor,
    *,
    bos_id: int,
    eos_id: int,
    search: SearchConfig,
) -> list[list[Hypothesis]]:
    """Greedy (``beam_size`` 1) or beam search: the ``search.nbest`` best per sentence."""
    fn = greedy_search if search.beam_size == 1 else beam_search
    return fn(model, src, bos_id=bos_id, eos_id=eos_id, search=search)


def generate(
    model: Transformer | Sequence[Transformer],
    src: Tensor,
    *,
    bos_id: int,
    eos_id: int,
    search: SearchConfig,
) -> Tensor:
    """The best output of :func:`search_batch` as ids ``(B, L)``: eos-ended, then padding."""
    best = [
        [*h[0].tokens, eos_id]
        for h in search_batch(model, src, bos_id=bos_id, eos_id=eos_id, search=search)
    ]
    pad = as_models(model)[0].pad_id
    out = torch.full((len(best), max(map(len, best))), pad, dtype=torch.long, device=src.device)
    for b, seq in enumerate(best):
        out[b, : len(seq)] = torch.tensor(seq, dtype=torch.long)
    return out
