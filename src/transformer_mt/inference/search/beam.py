"""Beam search (the paper's section 6.1): the ``beam_size`` best prefixes per sentence, over
the decoder's key/value cache, for one model or an ensemble.

The loop (:func:`beam_search`) is the same for every beam: it asks the models for the next
token's log-probabilities, lets the beam pick its extensions (:meth:`Beam.extend`), and drops
the sentences the beam says are done. Lexical constraints are a beam of their own
(:class:`~transformer_mt.inference.search.constraints.ConstrainedBeam`) behind the same four
methods.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from transformer_mt.inference.search.cancel import check_stop
from transformer_mt.inference.search.decoder import (
    Decoding,
    PrefixForcing,
    as_models,
    ban_specials,
    divisor,
    max_lengths,
)
from transformer_mt.inference.search.settings import Hypothesis, SearchConfig, Steering
from transformer_mt.model.transformer import Transformer


class Beam:
    """The state of a beam search: K live prefixes per sentence and the finished hypotheses.

    Every tensor is laid out sentence-major: row ``i * K + k`` is beam ``k`` of live sentence
    ``i``, whose original index is ``alive[i]``.
    """

    def __init__(
        self, src: Tensor, *, bos_id: int, eos_id: int, forced: Sequence[int],
        search: SearchConfig, steer: Steering,
    ) -> None:  # fmt: skip
        B, device, K = src.size(0), src.device, search.beam_size
        self.K, self.device, self.eos_id, self.search = K, device, eos_id, search
        #: per sentence: forced prefix tokens, left out of the length normalisation
        self.forced = list(forced)
        self.prefix = torch.full((B * K, 1), bos_id, dtype=torch.long, device=device)
        # Only beam 0 is live at the start, so the first step does not pick K copies of one token.
        self.scores = torch.full((B, K), -math.inf, device=device)  # summed log-probabilities
        self.scores[:, 0] = 0.0
        self.alive = torch.arange(B, device=device)
        #: per sentence: (ranking score, ids with eos)
        self.finished: list[list[tuple[float, list[int]]]] = [[] for _ in range(B)]

    def extend(self, lprobs: Tensor, at_cap: Tensor) -> Tensor:
        """Score all ``K x V`` extensions; set finished ones aside; keep the best K live.

        Takes the best ``2K`` candidates (fairseq's trick): those ending in eos among the first
        K are finished, and the best K that do not end continue, so the beam stays full.

        Returns:
            The rows ``(n*K,)`` of the previous prefixes that the new beams extend.
        """
        n, K, V, eos_id = self.alive.numel(), self.K, lprobs.size(-1), self.eos_id
        candidates = (self.scores.view(n * K, 1) + lprobs).view(n, K * V)  # (n, K * V)
        top_scores, top_index = candidates.topk(2 * K, dim=1)  # (n, 2K)
        top_beam, top_token = top_index // V, top_index % V  # (n, 2K)
        ends = (top_token[:, :K] == eos_id) & torch.isfinite(top_scores[:, :K])  # (n, K)
        length = self.prefix.size(1)  # generated tokens with this step's, eos included
        for i, j in ends.nonzero().tolist():
            b = int(self.alive[i])
            if len(self.finished[b]) < K:
                hyp = [*self.prefix[i * K + int(top_beam[i, j]), 1:].tolist(), eos_id]
                score = float(top_scores[i, j]) / divisor(length - self.forced[b], self.search)
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

    def results(self) -> list[list[Hypothesis]]:
        """The ``nbest`` best hypotheses per sentence, best first.

        Sentences that stopped without K finished hypotheses add their live beams.
        """
        for i, b in enumerate(self.alive.tolist()):
            if len(self.finished[b]) < self.K:
                for k in range(self.K):
                    total = float(self.scores[i, k])
                    if math.isfinite(total):
                        hyp = self.prefix[i * self.K + k, 1:].tolist()
                        norm = divisor(len(hyp) - self.forced[b], self.search)
                        self.finished[b].append((total / norm, hyp))
        out = []
        for hyps in self.finished:
            # sorted() is stable: ties keep their order.
            ranked = sorted(hyps, key=lambda h: -h[0])[: self.search.nbest]
            out.append([Hypothesis(strip_eos(h, self.eos_id), s) for s, h in ranked])
        return out


def strip_eos(seq: list[int], eos_id: int) -> list[int]:
    return seq[:-1] if seq and seq[-1] == eos_id else seq


def cap_to_eos(lprobs: Tensor, at_cap: Tensor, eos_id: int) -> None:
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
    steer: Steering | None = None,
    beam_type: type[Beam] = Beam,
) -> list[list[Hypothesis]]:
    """Keep the ``search.beam_size`` best prefixes per sentence; return the best finished ones.

    A sentence stops when it has K finished hypotheses (early stopping); they are ranked by the
    length-normalised score (:func:`~transformer_mt.inference.search.settings.length_penalty`)
    and the first ``search.nbest`` returned. With ``beam_size=1`` this is exactly greedy search.

    Args:
        model: A model, or several whose log-probabilities are averaged (an ensemble).
        src: Source token ids ``(B, S)`` padded with the models' pad id.
        steer: Forced prefixes (and the constraint phrases a ``beam_type`` may read).
        beam_type: Which beam picks the extensions: :class:`Beam`, or one with the same
            methods (the constrained beam).
    """
    models, K, steer = as_models(model), search.beam_size, steer or Steering()
    max_lens = max_lengths(models, src, search, steer)  # (B,)
    decoding = Decoding(models, src, search.use_cache)
    # Sentence-major copies: row b * K + k is beam k of sentence b.
    decoding.select(torch.arange(src.size(0), device=src.device).repeat_interleave(K))
    forcing = PrefixForcing(steer.prefixes, src.size(0), src.device)
    beam = beam_type(
        src, bos_id=bos_id, eos_id=eos_id, forced=forcing.lengths, search=search, steer=steer
    )
    for step in range(int(max_lens.max())):
        check_stop()
        lprobs = decoding.log_probs(beam.prefix, step)  # (n*K, V)
        ban_specials(lprobs, models[0].pad_id, bos_id)
        forcing.apply(lprobs, beam.alive.repeat_interleave(K), step)
        at_cap = step + 1 >= max_lens[beam.alive]  # (n,)
        cap_to_eos(lprobs, at_cap.repeat_interleave(K), eos_id)
        decoding.reorder_beams(beam.extend(lprobs, at_cap))
        done = beam.done(at_cap)
        if bool(done.all()):
            break
        if bool(done.any()):
            decoding.select(beam.keep((~done).nonzero().squeeze(1)))
    return beam.results()
