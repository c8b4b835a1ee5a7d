"""Lexical (terminology) constraints: the bookkeeping of a constrained beam search.

A sentence's constraints are target phrases, each a list of token ids, that every returned
hypothesis must contain, in any order, without overlapping. :class:`ConstraintState` follows one
hypothesis: which phrases it has completed and how far into one phrase it is. The search
(:func:`transformer_mt.inference.search.beam_search`) extends every beam with its best tokens
and with the tokens that advance a phrase, and only lets a hypothesis end once every phrase is
in it.

With constraints, hypotheses that have generated more constraint tokens would be crowded out
by cheaper unconstrained ones; :func:`allocate` keeps the beam spread over the numbers of
constraint tokens met ("banks"), the dynamic beam allocation of Post & Vilar (2018): each bank
gets an equal share of the K slots, and slots a bank cannot fill go to the others.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


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
class Candidate:
    """One extension of a beam: summed log-probability, the beam it extends, the token."""

    score: float
    beam: int
    token: int
    state: ConstraintState


def allocate(candidates: Sequence[Candidate], K: int) -> list[Candidate]:
    """The K candidates kept, spread over banks of equal :attr:`ConstraintState.progress`.

    Banks are visited from the most progress to the least, each first taking its best
    ``K // banks`` (the first ``K % banks`` banks one more); slots left over go to the best
    remaining candidates of any bank. The result is sorted by score, best first.
    """
    unique: dict[tuple[int, int], Candidate] = {}
    for c in sorted(candidates, key=lambda c: -c.score):
        unique.setdefault((c.beam, c.token), c)
    banks: dict[int, list[Candidate]] = {}
    for c in unique.values():
        banks.setdefault(c.state.progress, []).append(c)
    order = sorted(banks, reverse=True)
    share, extra = divmod(K, len(order)) if order else (0, 0)
    kept: list[Candidate] = []
    for rank, progress in enumerate(order):
        quota = share + (1 if rank < extra else 0)
        kept.extend(banks[progress][:quota])
    taken = {(c.beam, c.token) for c in kept}
    rest = [c for c in unique.values() if (c.beam, c.token) not in taken]
    kept.extend(rest[: K - len(kept)])
    return sorted(kept, key=lambda c: -c.score)
