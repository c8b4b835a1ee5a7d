"""What a search is asked for (:class:`SearchConfig`), what steers it (:class:`Steering`) and
what it returns (:class:`Hypothesis`), with the length normalisation that ranks beams."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

from torch import Tensor

from transformer_mt.errors import SettingError

#: How beam scores are normalised by length (:func:`length_penalty`).
LENGTH_NORMS = ("gnmt", "power")


# Hashable by value (it is never changed after construction): the service gives requests
# with equal searches one engine call.
@dataclass(unsafe_hash=True)
class SearchConfig:
    """Decoding options of greedy search, beam search and sampling.

    Args:
        beam_size: Hypotheses kept per sentence (1 = greedy search).
        length_penalty: The exponent alpha of the length normalisation
            (:func:`length_penalty`); 0 ranks by log-probability.
        length_norm: ``gnmt`` divides scores by ``((5 + |Y|) / 6) ** alpha`` (Wu et al.),
            ``power`` by ``|Y| ** alpha`` (fairseq, Hugging Face ``generate``, CTranslate2).
        max_len_a, max_len_b: Output cap ``max_len_a * source length + max_len_b`` tokens.
        use_cache: Decode with the key/value cache (``False`` recomputes every prefix).
        nbest: Hypotheses returned per sentence, best first (at most ``beam_size``); with
            sampling, the number of samples drawn per sentence, in the order drawn.
        sampling_topk: Sample each token from the K most likely (0 = the whole vocabulary);
            ``None`` (and no ``sampling_topp``) searches instead of sampling.
        sampling_topp: Sample from the smallest set of most likely tokens whose probability
            reaches P (nucleus sampling, Holtzman et al. 2020), in (0, 1].
        temperature: Divides the log-probabilities before sampling (> 1 flattens them).
        seed: Makes sampling reproducible: a sentence's samples depend on the seed and the
            sentence alone, not on the batch it is decoded in (``None``: a fresh seed).
    """

    beam_size: int = 1
    length_penalty: float = 0.6
    length_norm: str = "gnmt"
    max_len_a: float = 1.2
    max_len_b: int = 10
    use_cache: bool = True
    nbest: int = 1
    sampling_topk: int | None = None
    sampling_topp: float | None = None
    temperature: float = 1.0
    seed: int | None = None

    @property
    def sampling(self) -> bool:
        """Tokens are drawn at random rather than searched for."""
        return self.sampling_topk is not None or self.sampling_topp is not None

    def __post_init__(self) -> None:
        for name, example in (("length_penalty", 0.6), ("max_len_a", 1.2), ("temperature", 1)):
            _finite(name, getattr(self, name), example)
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
        if self.sampling:
            self._check_sampling()
        else:
            self._check_search()

    def _check_search(self) -> None:
        if not 1 <= self.nbest <= self.beam_size:
            raise ValueError(
                f"nbest={self.nbest} but a beam of {self.beam_size} keeps {self.beam_size} "
                f"hypotheses; ask for 1 to {self.beam_size}, or raise the beam size to "
                f"{max(self.nbest, 1)}"
            )
        given = {"temperature": self.temperature != 1.0, "seed": self.seed is not None}
        for name in (name for name, is_set in given.items() if is_set):
            raise SettingError(
                    f"{name} only applies to sampling", [("sampling_topk", 0)],
                    lead="sample with", tail="(the whole vocabulary) or a top-k or top-p",
                )  # fmt: skip

    def _check_sampling(self) -> None:
        if self.beam_size != 1:
            raise SettingError(
                f"sampling draws one token at a time, but beam_size is {self.beam_size}",
                [("beam_size", 1)], tail="(the n-best count sets the samples per sentence)",
            )  # fmt: skip
        if self.nbest < 1:
            raise SettingError(f"nbest must be >= 1, got {self.nbest}", [("nbest", 1)])
        if self.sampling_topk is not None and self.sampling_topk < 0:
            raise SettingError(
                f"sampling_topk must be >= 0, got {self.sampling_topk}", [("sampling_topk", 0)],
                tail="(the whole vocabulary) or more",
            )  # fmt: skip
        if self.sampling_topp is not None:
            _finite("sampling_topp", self.sampling_topp, 0.9)
            if not 0.0 < self.sampling_topp <= 1.0:
                raise SettingError(
                    f"sampling_topp must be in (0, 1], got {self.sampling_topp}",
                    [("sampling_topp", 0.9)], lead="use e.g.",
                )  # fmt: skip
        if not self.temperature > 0.0:
            raise SettingError(
                f"temperature must be > 0, got {self.temperature}", [("temperature", 1.0)],
                lead="use e.g.",
            )  # fmt: skip

    @classmethod
    def from_stored(cls, decoding: Mapping[str, Any] | None, **overrides: Any) -> SearchConfig:
        """The search a checkpoint stores (``decoding``; unknown keys ignored) with the
        non-``None`` ``overrides`` on top: the one way every command builds its search.

        Asking for sampling replaces a stored beam search by sampling (``beam_size`` 1, unless
        the overrides ask for a beam too, which is refused).
        """
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in (decoding or {}).items() if k in known}
        given = {k: v for k, v in overrides.items() if v is not None}
        if any(k in given for k in SAMPLING_KEYS) and "beam_size" not in given:
            values.update(beam_size=1, nbest=1)
        values.update(given)
        return cls(**values)


#: The settings that turn sampling on.
SAMPLING_KEYS = ("sampling_topk", "sampling_topp")


def _finite(name: str, value: float, example: float) -> None:
    if not math.isfinite(value):
        raise SettingError(
            f"{name} must be a finite number, got {value}", [(name, example)], lead="use e.g."
        )


@dataclass(frozen=True)
class Steering:
    """Per-sentence targets of one batch of sources (row ``i`` for source row ``i``).

    Attributes:
        prefixes: target ids each output must start with (decoding continues from them; the
            score covers the continuation only), or ``None``.
        constraints: target phrases (id lists) each output must contain, or ``None``.
    """

    prefixes: Sequence[Sequence[int]] | None = None
    constraints: Sequence[Sequence[Sequence[int]]] | None = None

    def rows(self, rows: Sequence[int]) -> Steering:
        """The steering of the source rows ``rows``, in that order."""
        return Steering(
            None if self.prefixes is None else [self.prefixes[r] for r in rows],
            None if self.constraints is None else [self.constraints[r] for r in rows],
        )


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
