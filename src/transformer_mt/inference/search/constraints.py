"""Lexical (terminology) constraints: the bookkeeping of a constrained beam search.

A sentence's constraints are target phrases, each a list of token ids, that every returned
hypothesis must contain, in any order, without overlapping. :class:`ConstraintState` follows
one hypothesis: which phrases it has completed and how far into one phrase it is.
:class:`ConstrainedBeam` extends every beam with its best tokens and with the tokens that
advance a phrase, and only lets a hypothesis end once every phrase is in it; the loop of
:func:`~transformer_mt.inference.search.beam.beam_search` runs it as it runs the plain beam.

With constraints, hypotheses that have generated more constraint tokens would be crowded out
by cheaper unconstrained ones; :func:`allocate` keeps the beam spread over the numbers of
constraint tokens met ("banks"), the dynamic beam allocation of Post & Vilar (2018): each bank
gets an equal share of the K slots, and slots a bank cannot fill go to the others.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from transformer_mt.inference.search.beam import Beam
from transformer_mt.inference.search.decoder import divisor
from transformer_mt.inference.search.settings import Hypothesis, SearchConfig, Steering

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ConstraintState:
    """How far one hypothesis is through its sentence's constraints.

    Attributes:
        phrases: every constraint of the sentence, as token ids.
        met: indices of the phrases the hypothesis contains.
        current: the phrase it is in the middle of and how many of its tokens it has
            generated, or ``None``.
    """

    phrases: tuple[tuple[int, ...], ...]
    met: frozenset[int] = frozenset()
    current: tuple[int, int] | None = None

    @property
    def progress(self) -> int:
        """Constraint tokens generated: the phrases met in full and the current one's part."""
        done = sum(len(self.phrases[i]) for i in self.met)
        return done + (self.current[1] if self.current else 0)

    @property
    def finished(self) -> bool:
        """Every phrase is in the hypothesis (it may end)."""
        return len(self.met) == len(self.phrases)

    def wanted(self) -> set[int]:
        """The tokens that advance a phrase from here."""
        if self.current is not None:
            phrase, done = self.current
            return {self.phrases[phrase][done]}
        return {p[0] for i, p in enumerate(self.phrases) if i not in self.met}

    def advance(self, token: int) -> ConstraintState:
        """The state after ``token``.

        A token that breaks off the current phrase abandons it (the phrase can start again
        later); a token that starts a phrase not yet met begins it.
        """
        if self.current is not None:
            phrase, done = self.current
            if self.phrases[phrase][done] == token:
                return self._step(phrase, done + 1)
        for i, p in enumerate(self.phrases):
            if i not in self.met and p[0] == token:
                return self._step(i, 1)
        return ConstraintState(self.phrases, self.met)

    def _step(self, phrase: int, done: int) -> ConstraintState:
        if done == len(self.phrases[phrase]):
            return ConstraintState(self.phrases, self.met | {phrase})
        return ConstraintState(self.phrases, self.met, (phrase, done))


@dataclass(frozen=True)
class Extension:
    """One extension of a beam: summed log-probability, the beam it extends, the token."""

    score: float
    beam: int
    token: int
    state: ConstraintState


def allocate(candidates: Sequence[Extension], K: int) -> list[Extension]:
    """The K candidates kept, spread over banks of equal :attr:`ConstraintState.progress`.

    Banks are visited from the most progress to the least, each first taking its best
    ``K // banks`` (the first ``K % banks`` banks one more); slots left over go to the best
    remaining candidates of any bank. The result is sorted by score, best first.
    """
    unique: dict[tuple[int, int], Extension] = {}
    for c in sorted(candidates, key=lambda c: -c.score):
        unique.setdefault((c.beam, c.token), c)
    banks: dict[int, list[Extension]] = {}
    for c in unique.values():
        banks.setdefault(c.state.progress, []).append(c)
    order = sorted(banks, reverse=True)
    share, extra = divmod(K, len(order)) if order else (0, 0)
    kept: list[Extension] = []
    for rank, progress in enumerate(order):
        quota = share + (1 if rank < extra else 0)
        kept.extend(banks[progress][:quota])
    taken = {(c.beam, c.token) for c in kept}
    rest = [c for c in unique.values() if (c.beam, c.token) not in taken]
    kept.extend(rest[: K - len(kept)])
    return sorted(kept, key=lambda c: -c.score)


class ConstrainedBeam(Beam):
    """A beam whose hypotheses must contain their sentence's constraint phrases.

    Each beam carries a :class:`ConstraintState`. Besides the best ``2K`` extensions of the
    sentence, every beam proposes its best token and the tokens that advance a phrase; the K
    kept are spread over the numbers of constraint tokens met (:func:`allocate`). ``<eos>`` is
    allowed only once every phrase is in (or at the length cap, where a hypothesis that still
    misses one is kept only as a last resort, and reported).
    """

    def __init__(
        self, src: Tensor, *, bos_id: int, eos_id: int, forced: Sequence[int],
        search: SearchConfig, steer: Steering,
    ) -> None:  # fmt: skip
        super().__init__(
            src, bos_id=bos_id, eos_id=eos_id, forced=forced, search=search, steer=steer
        )
        K = self.K
        phrases = [tuple(tuple(p) for p in c) for c in steer.constraints or ()]
        self.states = [ConstraintState(phrases[b]) for b in range(src.size(0)) for _ in range(K)]
        #: per sentence: hypotheses that ended at the cap without every phrase
        self.fallback: list[list[tuple[float, list[int]]]] = [[] for _ in range(src.size(0))]

    def extend(self, lprobs: Tensor, at_cap: Tensor) -> Tensor:
        n, K, capped, eos_id = self.alive.numel(), self.K, at_cap.tolist(), self.eos_id
        open_rows = [r for r, s in enumerate(self.states) if not s.finished and not capped[r // K]]
        if open_rows:
            lprobs[open_rows, eos_id] = -math.inf
        totals = self.scores.view(n * K, 1) + lprobs  # (n*K, V)
        proposals = self._proposals(totals, eos_id)
        length = self.prefix.size(1)
        kept_all: list[Extension] = []
        for i, found in enumerate(proposals):
            b = int(self.alive[i])
            ranked = sorted(found, key=lambda c: -c[0])
            for score, k, token in ranked:
                if token == eos_id:
                    hyp = [*self.prefix[i * K + k, 1:].tolist(), eos_id]
                    entry = (score / divisor(length - self.forced[b], self.search), hyp)
                    done = self.states[i * K + k].finished
                    _keep_best(self.finished[b] if done else self.fallback[b], entry, K)
            live = [
                Extension(score, k, token, self.states[i * K + k].advance(token))
                for score, k, token in ranked
                if token != eos_id
            ]
            kept = allocate(live, K)
            pad = Extension(-math.inf, 0, eos_id, self.states[i * K])
            kept_all.extend(kept + [pad] * (K - len(kept)))
        self.states = [c.state for c in kept_all]
        self.scores = torch.tensor([c.score for c in kept_all], device=self.device).view(n, K)
        beam = torch.tensor([c.beam for c in kept_all], device=self.device).view(n, K)
        token = torch.tensor([c.token for c in kept_all], device=self.device).view(n, K)
        rows = (torch.arange(n, device=self.device)[:, None] * K + beam).view(-1)  # (n*K,)
        self.prefix = torch.cat([self.prefix[rows], token.view(-1, 1)], dim=1)
        return rows

    def _proposals(self, totals: Tensor, eos_id: int) -> list[list[tuple[float, int, int]]]:
        """Per live sentence: the distinct ``(summed log-probability, beam, token)``
        extensions worth keeping, with finite scores: the sentence's best ``2K``, each beam's
        best token, the tokens that advance a phrase and, for beams with every phrase,
        ``<eos>``."""
        n, K, V = self.alive.numel(), self.K, totals.size(-1)
        top_scores, top_index = totals.view(n, K * V).topk(2 * K, dim=1)  # (n, 2K)
        best = totals.argmax(dim=1).tolist()  # (n*K,)
        wanted = [
            (r, t)
            for r, state in enumerate(self.states)
            for t in sorted(state.wanted() | {best[r]} | ({eos_id} if state.finished else set()))
        ]
        scores = totals[[r for r, _ in wanted], [t for _, t in wanted]].tolist()
        found: list[dict[tuple[int, int], float]] = [
            {(j // V, j % V): s for s, j in zip(row_scores, index)}
            for row_scores, index in zip(top_scores.tolist(), top_index.tolist())
        ]
        for (r, t), s in zip(wanted, scores):
            found[r // K][(r % K, t)] = s
        return [[(s, k, t) for (k, t), s in cands.items() if math.isfinite(s)] for cands in found]

    def done(self, at_cap: Tensor) -> Tensor:
        """Live sentences at their cap, or with K finished hypotheses none of whose live beams
        could still rank above (its score so far, normalised as if it ended now, is below the
        K-th finished one: Hugging Face's ``early_stopping=False`` rule).

        Stopping at the first K finished, as the plain beam does, would keep the hypotheses
        that end right after their last phrase and lose the fluent ones still being built.
        """
        K, length = self.K, self.prefix.size(1)
        out = []
        for i, b in enumerate(self.alive.tolist()):
            finished = self.finished[b]
            if len(finished) < K:
                out.append(False)
                continue
            best_live = float(self.scores[i].max()) / divisor(length - self.forced[b], self.search)
            out.append(best_live < min(score for score, _ in finished))
        return torch.tensor(out, dtype=torch.bool, device=self.device) | at_cap

    def keep(self, keep: Tensor) -> Tensor:
        rows = super().keep(keep)
        self.states = [self.states[r] for r in rows.tolist()]
        return rows

    def results(self) -> list[list[Hypothesis]]:
        """As :meth:`Beam.results`, from the hypotheses with every phrase; a sentence with
        none falls back to its best ones without (and a warning says how many)."""
        K = self.K
        for i, b in enumerate(self.alive.tolist()):
            for k in range(K):
                total, state = float(self.scores[i, k]), self.states[i * K + k]
                if math.isfinite(total) and len(self.finished[b]) < K:
                    hyp = self.prefix[i * K + k, 1:].tolist()
                    entry = (total / divisor(len(hyp) - self.forced[b], self.search), hyp)
                    (self.finished[b] if state.finished else self.fallback[b]).append(entry)
        unsatisfied = 0
        for b, hyps in enumerate(self.finished):
            if not hyps:
                unsatisfied += 1
                hyps.extend(self.fallback[b])
        if unsatisfied:
            log.warning(
                "%d of %d sentences could not fit every constraint phrase within their length "
                "cap; their outputs miss a phrase (raise max_len_b)", unsatisfied,
                len(self.finished),
            )  # fmt: skip
        self.alive = self.alive[:0]  # the live beams are in `finished` now
        return super().results()


def _keep_best(hyps: list[tuple[float, list[int]]], entry: tuple[float, list[int]], K: int) -> None:
    """Add ``entry`` to ``hyps``, keeping the K best (in place)."""
    hyps.append(entry)
    if len(hyps) > K:
        hyps.remove(min(hyps, key=lambda h: h[0]))
