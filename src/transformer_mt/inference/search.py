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

import contextlib
import contextvars
import hashlib
import logging
import math
import secrets
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

import torch
from torch import Tensor

from transformer_mt.errors import SettingError
from transformer_mt.inference.constraints import Candidate, ConstraintState, allocate
from transformer_mt.model.attention import frozen_weights
from transformer_mt.model.decoding_step import DecodingStep, StepState
from transformer_mt.model.kv_cache import KVCache
from transformer_mt.model.transformer import Transformer

log = logging.getLogger(__name__)

#: How beam scores are normalised by length (:func:`length_penalty`).
LENGTH_NORMS = ("gnmt", "power")


class DecodingCancelled(RuntimeError):
    """A search stopped between two decoding steps because its caller asked (:func:`stop_when`)."""


#: The check every search in this context consults once per step (``None``: never stop).
_SHOULD_STOP: contextvars.ContextVar[Callable[[], bool] | None] = contextvars.ContextVar(
    "should_stop", default=None
)


@contextlib.contextmanager
def stop_when(should_stop: Callable[[], bool] | None) -> Iterator[None]:
    """Within the block, each search on this thread calls ``should_stop()`` once per decoding
    step (:func:`check_stop`) and raises :class:`DecodingCancelled` once it is true.

    Scoped rather than an argument, so that it reaches the search through any engine and the
    decode loop without their interfaces changing: the service sets it when every caller of an
    engine call has gone, and the worker is free again one step later.
    """
    token = _SHOULD_STOP.set(should_stop)
    try:
        yield
    finally:
        _SHOULD_STOP.reset(token)


def check_stop() -> None:
    """Raise :class:`DecodingCancelled` if the check of :func:`stop_when` says so."""
    should_stop = _SHOULD_STOP.get()
    if should_stop is not None and should_stop():
        raise DecodingCancelled("decoding stopped between two steps: its caller asked")


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
        return _ensemble_mean(out)

    def select(self, rows: Tensor) -> None:
        """Keep (and order) the rows ``rows`` of every model's memory, mask and cache."""
        for state in self.states:
            state[0], state[1] = state[0][rows], state[1][rows]
            for cache in state[2] or ():
                _select_cache(cache, rows)

    def reorder_beams(self, rows: Tensor, written: int) -> None:
        """Beams moved within their sentence: only the self-attention caches follow (each
        holds the ``written`` positions so far).

        A sentence's K rows of cross-attention keys/values are identical, so they stay.
        """
        for _, _, cache in self.states:
            for self_cache, _ in cache or ():
                self_cache.reorder(rows)


class _SteppedDecoding:
    """:class:`_Decoding` through one :class:`DecodingStep` per model (e.g. compiled): the same
    log-probabilities from buffers whose shapes stay fixed for the search's ``length`` steps."""

    def __init__(
        self, models: list[Transformer], src: Tensor, steps: Sequence[DecodingStep], length: int
    ) -> None:
        if len(steps) != len(models):
            raise ValueError(f"{len(models)} models need as many decoding steps, got {len(steps)}")
        self.steps = list(steps)
        self.states: list[StepState] = []
        for model, step in zip(models, self.steps):
            memory, src_mask = model.encode(src)
            self.states.append(step.start(memory, src_mask, length))

    def log_probs(self, prefix: Tensor, step: int) -> Tensor:
        """As :meth:`_Decoding.log_probs`."""
        # The step as a tensor of its own (not a view): a compiled step reads it as data.
        token, position = prefix[:, -1:], torch.tensor(step, device=prefix.device)
        return _ensemble_mean(
            [s.log_probs(token, position, state) for s, state in zip(self.steps, self.states)]
        )

    def select(self, rows: Tensor) -> None:
        for state in self.states:
            state.select(rows)

    def reorder_beams(self, rows: Tensor, written: int) -> None:
        for state in self.states:
            state.reorder_self(rows, written)


def _ensemble_mean(lprobs: list[Tensor]) -> Tensor:
    """The mean of the models' log-probabilities ``(n, V)`` each (one model: its own)."""
    return lprobs[0] if len(lprobs) == 1 else torch.stack(lprobs).mean(dim=0)


def _decoding(
    models: list[Transformer],
    src: Tensor,
    search: SearchConfig,
    length: int,
    steps: Sequence[DecodingStep] | None,
) -> _Decoding | _SteppedDecoding:
    """The decoding state of a search of at most ``length`` steps: through ``steps`` where
    given, else :meth:`Transformer.decode` (over the cache unless ``search.use_cache`` is off)."""
    if steps is None or not search.use_cache:
        return _Decoding(models, src, search.use_cache)
    return _SteppedDecoding(models, src, steps, length)


def _select_cache(layer: tuple[KVCache, KVCache], index: Tensor) -> None:
    for cache in layer:
        cache.reorder(index)


def _max_lengths(
    models: list[Transformer], src: Tensor, search: SearchConfig, steer: Steering
) -> Tensor:
    """:func:`output_caps` of the padded sources ``src (B, S)`` for these models, ``(B,)``."""
    src_len = (src != models[0].pad_id).sum(dim=1)  # (B,)
    return output_caps(src_len, search, steer, min(m.config.max_len for m in models))


def output_caps(src_len: Tensor, search: SearchConfig, steer: Steering, max_len: int) -> Tensor:
    """Per-sentence cap on generated tokens (eos included), ``(B,)``: the one rule of every
    engine, for sources of ``src_len`` tokens (``<eos>`` included) and a model of ``max_len``
    positions.

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


def _ban_specials(lprobs: Tensor, pad_id: int, bos_id: int) -> None:
    """Never generate padding or a second ``<bos>`` (in place)."""
    lprobs[:, pad_id] = -math.inf
    lprobs[:, bos_id] = -math.inf


class _Forcing:
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


class _Sampler:
    """Draws each row's next token by inverse-transform sampling from its own random numbers.

    A sentence's numbers (one per decoding step) come from a generator seeded with the search's
    seed, its source ids and the sample's number, drawn once at the start: its samples do not
    depend on which other sentences share the batch, and each step draws for all rows at once.
    """

    def __init__(
        self, search: SearchConfig, src: Tensor, *, pad_id: int, samples: int, steps: int
    ) -> None:
        self.search, self.step = search, 0
        base = secrets.randbits(63) if search.seed is None else search.seed
        uniforms = []
        for row in src.tolist():
            ids = [t for t in row if t != pad_id]
            for k in range(samples):
                digest = hashlib.blake2b(f"{base}:{k}:{ids}".encode(), digest_size=8).digest()
                generator = torch.Generator().manual_seed(int.from_bytes(digest, "little") >> 1)
                uniforms.append(torch.rand(steps, generator=generator, dtype=torch.float64))
        self.uniforms = torch.stack(uniforms).to(src.device)  # (rows, steps)

    def __call__(self, lprobs: Tensor, rows: Tensor) -> Tensor:
        """One token per row of ``lprobs (n, V)`` at the next step; ``rows``: each row's
        random numbers. The token is the first whose cumulative probability passes the row's
        number: a token of probability 0 is never drawn."""
        probs = _filtered(lprobs / self.search.temperature, self.search).softmax(dim=-1)
        cdf = probs.double().cumsum(dim=-1)  # (n, V)
        u = self.uniforms[rows, self.step, None] * cdf[:, -1:]  # (n, 1)
        self.step += 1
        token = torch.searchsorted(cdf, u, right=True).squeeze(1)  # (n,)
        # A number rounded up to the total would pass every token: take the last likely one.
        last = probs.size(-1) - 1 - (probs.flip(-1) > 0).int().argmax(dim=-1)
        return torch.minimum(token, last)


def _filtered(logits: Tensor, search: SearchConfig) -> Tensor:
    """``logits (n, V)`` with every token outside the top-k and the top-p set at -inf."""
    k = search.sampling_topk
    if k:
        kth = logits.topk(min(k, logits.size(-1)), dim=-1).values[:, -1:]  # (n, 1)
        logits = logits.masked_fill(logits < kth, -math.inf)
    p = search.sampling_topp
    if p is not None and p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        probs = sorted_logits.softmax(dim=-1)
        # A token stays if the more likely ones before it reach less than p: the first always.
        drop_sorted = probs.cumsum(dim=-1) - probs >= p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, -math.inf)
    return logits


def _token_by_token(
    models: list[Transformer],
    src: Tensor,
    choose: Callable[[Tensor, Tensor], Tensor],
    *,
    bos_id: int,
    eos_id: int,
    search: SearchConfig,
    steer: Steering,
    decoding_steps: Sequence[DecodingStep] | None,
) -> list[Hypothesis]:
    """Decode one token per sentence per step, picked by ``choose(lprobs, rows)``."""
    B, device = src.size(0), src.device
    max_lens = _max_lengths(models, src, search, steer)  # (B,)
    steps = int(max_lens.max())
    decoding = _decoding(models, src, search, steps, decoding_steps)
    forcing = _Forcing(steer.prefixes, B, device)
    out = torch.full((B, steps), eos_id, dtype=torch.long, device=device)
    log_prob = torch.zeros(B, device=device)  # (B,)
    alive = torch.arange(B, device=device)  # rows of `out` still being decoded
    prefix = torch.full((B, 1), bos_id, dtype=torch.long, device=device)  # (B_alive, t + 1)
    for step in range(steps):
        check_stop()
        lprobs = decoding.log_probs(prefix, step)  # (B_alive, V)
        _ban_specials(lprobs, models[0].pad_id, bos_id)
        forcing.apply(lprobs, alive, step)
        next_token = choose(lprobs, alive)  # (B_alive,)
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
        _hypothesis(row, lp, forced, search, eos_id)
        for row, lp, forced in zip(out.tolist(), log_prob.tolist(), forcing.lengths)
    ]


@torch.no_grad()
def greedy_search(
    model: Transformer | Sequence[Transformer],
    src: Tensor,
    *,
    bos_id: int,
    eos_id: int,
    search: SearchConfig,
    steer: Steering | None = None,
    decoding_steps: Sequence[DecodingStep] | None = None,
) -> list[list[Hypothesis]]:
    """Pick the most likely token at every step (``search.beam_size`` is not read).

    Args:
        model: A model, or several whose log-probabilities are averaged (an ensemble).
        src: Source token ids ``(B, S)`` padded with the models' pad id.
        steer: Forced prefixes (constraints need :func:`beam_search`).
        decoding_steps: One :class:`DecodingStep` per model (e.g. compiled) to decode with
            instead of :meth:`Transformer.decode`; the results are the same.

    Returns:
        One single-hypothesis list per sentence.
    """
    found = _token_by_token(
        as_models(model), src, lambda lprobs, rows: lprobs.argmax(dim=-1),
        bos_id=bos_id, eos_id=eos_id, search=search, steer=steer or Steering(),
        decoding_steps=decoding_steps,
    )  # fmt: skip
    return [[h] for h in found]


@torch.no_grad()
def sample(
    model: Transformer | Sequence[Transformer],
    src: Tensor,
    *,
    bos_id: int,
    eos_id: int,
    search: SearchConfig,
    steer: Steering | None = None,
    decoding_steps: Sequence[DecodingStep] | None = None,
) -> list[list[Hypothesis]]:
    """Draw ``search.nbest`` outputs per sentence, each token from the tempered, top-k and
    top-p filtered distribution (:class:`SearchConfig`), in the order drawn.

    A sample's score is its model log-probability (untempered, unfiltered) over the length
    penalty, as for greedy search.
    """
    models, n = as_models(model), search.nbest
    steer = steer or Steering()
    rows = torch.arange(src.size(0), device=src.device).repeat_interleave(n)
    steps = min(m.config.max_len for m in models)
    choose = _Sampler(search, src, pad_id=models[0].pad_id, samples=n, steps=steps)
    found = _token_by_token(
        models, src[rows], choose, bos_id=bos_id, eos_id=eos_id, search=search,
        steer=steer.rows(rows.tolist()), decoding_steps=decoding_steps,
    )  # fmt: skip
    return [found[i : i + n] for i in range(0, len(found), n)]


def _hypothesis(
    row: list[int], log_prob: float, forced: int, search: SearchConfig, eos_id: int
) -> Hypothesis:
    """An output row (ended by its first ``<eos>``) as a :class:`Hypothesis`; ``forced``
    prefix tokens are not counted in the length normalisation (they cost nothing)."""
    tokens = row[: row.index(eos_id)]
    return Hypothesis(tokens, log_prob / _divisor(len(tokens) + 1 - forced, search))


def _divisor(length: int, search: SearchConfig) -> float:
    return length_penalty(length, search.length_penalty, search.length_norm)


class _Beam:
    """The state of a beam search: K live prefixes per sentence and the finished hypotheses.

    Every tensor is laid out sentence-major: row ``i * K + k`` is beam ``k`` of live sentence
    ``i``, whose original index is ``alive[i]``.
    """

    def __init__(self, src: Tensor, bos_id: int, K: int, forced: Sequence[int]) -> None:
        B, device = src.size(0), src.device
        self.K, self.device = K, device
        #: per sentence: forced prefix tokens, left out of the length normalisation
        self.forced = list(forced)
        self.prefix = torch.full((B * K, 1), bos_id, dtype=torch.long, device=device)
        # Only beam 0 is live at the start, so the first step does not pick K copies of one token.
        self.scores = torch.full((B, K), -math.inf, device=device)  # summed log-probabilities
        self.scores[:, 0] = 0.0
        self.alive = torch.arange(B, device=device)
        #: per sentence: (ranking score, ids with eos)
        self.finished: list[list[tuple[float, list[int]]]] = [[] for _ in range(B)]

    def extend(self, lprobs: Tensor, at_cap: Tensor, eos_id: int, search: SearchConfig) -> Tensor:
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
                score = float(top_scores[i, j]) / _divisor(length - self.forced[b], search)
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
                        divisor = _divisor(len(hyp) - self.forced[b], search)
                        self.finished[b].append((total / divisor, hyp))
        out = []
        for hyps in self.finished:
            # sorted() is stable: ties keep their order.
            ranked = sorted(hyps, key=lambda h: -h[0])[: search.nbest]
            out.append([Hypothesis(_strip_eos(h, eos_id), s) for s, h in ranked])
        return out


class _ConstrainedBeam(_Beam):
    """A beam whose hypotheses must contain their sentence's constraint phrases.

    Each beam carries a :class:`ConstraintState`. Besides the best ``2K`` extensions of the
    sentence, every beam proposes its best token and the tokens that advance a phrase; the K
    kept are spread over the numbers of constraint tokens met (:func:`allocate`). ``<eos>`` is
    allowed only once every phrase is in (or at the length cap, where a hypothesis that still
    misses one is kept only as a last resort, and reported).
    """

    def __init__(
        self,
        src: Tensor,
        bos_id: int,
        K: int,
        forced: Sequence[int],
        *,
        constraints: Sequence[Sequence[Sequence[int]]],
        search: SearchConfig,
    ) -> None:
        super().__init__(src, bos_id, K, forced)
        self.search = search
        #: per sentence: no phrases, so it is searched exactly as by the plain beam
        self.plain = [not c for c in constraints]
        phrases = [tuple(tuple(p) for p in c) for c in constraints]
        self.states = [ConstraintState(phrases[b]) for b in range(src.size(0)) for _ in range(K)]
        #: per sentence: hypotheses that ended at the cap without every phrase
        self.fallback: list[list[tuple[float, list[int]]]] = [[] for _ in range(src.size(0))]
        #: sentences returned without every phrase
        self.unsatisfied = 0

    def extend(self, lprobs: Tensor, at_cap: Tensor, eos_id: int, search: SearchConfig) -> Tensor:
        n, K, capped = self.alive.numel(), self.K, at_cap.tolist()
        open_rows = [r for r, s in enumerate(self.states) if not s.finished and not capped[r // K]]
        if open_rows:
            lprobs[open_rows, eos_id] = -math.inf
        totals = self.scores.view(n * K, 1) + lprobs  # (n*K, V)
        proposals = self._proposals(totals, eos_id)
        length = self.prefix.size(1)
        kept_all: list[Candidate] = []
        for i, found in enumerate(proposals):
            b = int(self.alive[i])
            ranked = sorted(found, key=lambda c: -c[0])
            # A sentence without phrases finishes as in the plain beam: its top K only.
            for score, k, token in ranked[:K] if self.plain[b] else ranked:
                if token == eos_id:
                    hyp = [*self.prefix[i * K + k, 1:].tolist(), eos_id]
                    entry = (score / _divisor(length - self.forced[b], search), hyp)
                    done = self.states[i * K + k].finished
                    target = self.finished[b] if done else self.fallback[b]
                    if not self.plain[b]:
                        _keep_best(target, entry, K)
                    elif len(target) < K:
                        target.append(entry)
            live = [
                Candidate(score, k, token, self.states[i * K + k].advance(token))
                for score, k, token in ranked
                if token != eos_id
            ]
            kept = allocate(live, K)
            pad = Candidate(-math.inf, 0, eos_id, self.states[i * K])
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
            if len(finished) < K or self.plain[b]:
                out.append(len(finished) >= K)
                continue
            best_live = float(self.scores[i].max()) / _divisor(length - self.forced[b], self.search)
            out.append(best_live < min(score for score, _ in finished))
        return torch.tensor(out, dtype=torch.bool, device=self.device) | at_cap

    def keep(self, keep: Tensor) -> Tensor:
        rows = super().keep(keep)
        self.states = [self.states[r] for r in rows.tolist()]
        return rows

    def results(self, search: SearchConfig, eos_id: int) -> list[list[Hypothesis]]:
        """As :meth:`_Beam.results`, from the hypotheses with every phrase; a sentence with
        none falls back to its best ones without (counted in :attr:`unsatisfied`)."""
        K = self.K
        for i, b in enumerate(self.alive.tolist()):
            for k in range(K):
                total, state = float(self.scores[i, k]), self.states[i * K + k]
                if math.isfinite(total) and len(self.finished[b]) < K:
                    hyp = self.prefix[i * K + k, 1:].tolist()
                    entry = (total / _divisor(len(hyp) - self.forced[b], search), hyp)
                    (self.finished[b] if state.finished else self.fallback[b]).append(entry)
        for b, hyps in enumerate(self.finished):
            if not hyps:
                self.unsatisfied += 1
                hyps.extend(self.fallback[b])
        self.alive = self.alive[:0]  # the live beams are in `finished` now
        return super().results(search, eos_id)


def _keep_best(hyps: list[tuple[float, list[int]]], entry: tuple[float, list[int]], K: int) -> None:
    """Add ``entry`` to ``hyps``, keeping the K best (in place)."""
    hyps.append(entry)
    if len(hyps) > K:
        hyps.remove(min(hyps, key=lambda h: h[0]))


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
    steer: Steering | None = None,
    decoding_steps: Sequence[DecodingStep] | None = None,
) -> list[list[Hypothesis]]:
    """Keep the ``search.beam_size`` best prefixes per sentence; return the best finished ones.

    A sentence stops when it has K finished hypotheses (early stopping); they are ranked by the
    length-normalised score (:func:`length_penalty`) and the first ``search.nbest`` returned.
    With ``beam_size=1`` this is exactly greedy search. With constraints (``steer``), the
    beam is spread over the constraint tokens met (:mod:`~transformer_mt.inference.constraints`)
    and only hypotheses that contain every phrase may end.

    Args:
        model: A model, or several whose log-probabilities are averaged (an ensemble).
        src: Source token ids ``(B, S)`` padded with the models' pad id.
        steer: Forced prefixes and constraint phrases per sentence.
        decoding_steps: As for :func:`greedy_search`.
    """
    models, K, steer = as_models(model), search.beam_size, steer or Steering()
    max_lens = _max_lengths(models, src, search, steer)  # (B,)
    decoding = _decoding(models, src, search, int(max_lens.max()), decoding_steps)
    # Sentence-major copies: row b * K + k is beam k of sentence b.
    decoding.select(torch.arange(src.size(0), device=src.device).repeat_interleave(K))
    forcing = _Forcing(steer.prefixes, src.size(0), src.device)
    beam = (
        _Beam(src, bos_id, K, forcing.lengths)
        if steer.constraints is None
        else _ConstrainedBeam(
            src, bos_id, K, forcing.lengths, constraints=steer.constraints, search=search
        )
    )
    for step in range(int(max_lens.max())):
        check_stop()
        lprobs = decoding.log_probs(beam.prefix, step)  # (n*K, V)
        _ban_specials(lprobs, models[0].pad_id, bos_id)
        forcing.apply(lprobs, beam.alive.repeat_interleave(K), step)
        at_cap = step + 1 >= max_lens[beam.alive]  # (n,)
        _cap_to_eos(lprobs, at_cap.repeat_interleave(K), eos_id)
        decoding.reorder_beams(beam.extend(lprobs, at_cap, eos_id, search), written=step + 1)
        done = beam.done(at_cap)
        if bool(done.all()):
            break
        if bool(done.any()):
            decoding.select(beam.keep((~done).nonzero().squeeze(1)))
    results = beam.results(search, eos_id)
    if isinstance(beam, _ConstrainedBeam) and beam.unsatisfied:
        log.warning(
            "%d of %d sentences could not fit every constraint phrase within their length cap; "
            "their outputs miss a phrase (raise max_len_b)", beam.unsatisfied, src.size(0),
        )  # fmt: skip
    return results


def search_batch(
    model: Transformer | Sequence[Transformer],
    src: Tensor,
    *,
    bos_id: int,
    eos_id: int,
    search: SearchConfig,
    steer: Steering | None = None,
    decoding_steps: Sequence[DecodingStep] | None = None,
) -> list[list[Hypothesis]]:
    """The ``search.nbest`` outputs per sentence: sampled, greedy (``beam_size`` 1) or beam
    search; constraints always take the (constrained) beam search. ``decoding_steps``: as for
    :func:`greedy_search`."""
    steer = steer or Steering()
    if search.sampling and steer.constraints is not None and any(steer.constraints):
        raise SettingError(
            "constraints need a beam search, but the search samples", [("beam_size", 5)],
            lead="leave out the sampling options and search with e.g.",
        )  # fmt: skip
    if search.sampling:
        fn = sample
    elif search.beam_size == 1 and steer.constraints is None:
        fn = greedy_search
    else:
        fn = beam_search
    # The weights do not change during a search: each attention layer joins its projection
    # weights once for every step.
    with frozen_weights(*as_models(model)):
        return fn(
            model, src, bos_id=bos_id, eos_id=eos_id, search=search, steer=steer,
            decoding_steps=decoding_steps,
        )  # fmt: skip


def generate(
    model: Transformer | Sequence[Transformer],
    src: Tensor,
    *,
    bos_id: int,
    eos_id: int,
    search: SearchConfig,
    decoding_steps: Sequence[DecodingStep] | None = None,
) -> Tensor:
    """The best output of :func:`search_batch` as ids ``(B, L)``: eos-ended, then padding."""
    found = search_batch(
        model, src, bos_id=bos_id, eos_id=eos_id, search=search, decoding_steps=decoding_steps
    )
    best = [[*h[0].tokens, eos_id] for h in found]
    pad = as_models(model)[0].pad_id
    out = torch.full((len(best), max(map(len, best))), pad, dtype=torch.long, device=src.device)
    for b, seq in enumerate(best):
        out[b, : len(seq)] = torch.tensor(seq, dtype=torch.long)
    return out
