"""The token-by-token loop: greedy search (the most likely token at every step) and sampling
(a token drawn from the tempered, top-k and top-p filtered distribution).

Sentences that have finished are dropped from the batch, so the work per step shrinks as the
batch ends.
"""

from __future__ import annotations

import hashlib
import math
import secrets
from collections.abc import Callable, Sequence

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


def token_by_token(
    models: list[Transformer],
    src: Tensor,
    choose: Callable[[Tensor, Tensor], Tensor],
    *,
    bos_id: int,
    eos_id: int,
    search: SearchConfig,
    steer: Steering,
) -> list[Hypothesis]:
    """Decode one token per sentence per step, picked by ``choose(lprobs, rows)``."""
    B, device = src.size(0), src.device
    max_lens = max_lengths(models, src, search, steer)  # (B,)
    steps = int(max_lens.max())
    decoding = Decoding(models, src, search.use_cache)
    forcing = PrefixForcing(steer.prefixes, B, device)
    out = torch.full((B, steps), eos_id, dtype=torch.long, device=device)
    log_prob = torch.zeros(B, device=device)  # (B,)
    alive = torch.arange(B, device=device)  # rows of `out` still being decoded
    prefix = torch.full((B, 1), bos_id, dtype=torch.long, device=device)  # (B_alive, t + 1)
    for step in range(steps):
        check_stop()
        lprobs = decoding.log_probs(prefix, step)  # (B_alive, V)
        ban_specials(lprobs, models[0].pad_id, bos_id)
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
        hypothesis(row, lp, forced, search, eos_id)
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
) -> list[list[Hypothesis]]:
    """Pick the most likely token at every step (``search.beam_size`` is not read).

    Args:
        model: A model, or several whose log-probabilities are averaged (an ensemble).
        src: Source token ids ``(B, S)`` padded with the models' pad id.
        steer: Forced prefixes (constraints need :func:`beam_search`).

    Returns:
        One single-hypothesis list per sentence.
    """
    found = token_by_token(
        as_models(model), src, lambda lprobs, rows: lprobs.argmax(dim=-1),
        bos_id=bos_id, eos_id=eos_id, search=search, steer=steer or Steering(),
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
    choose = Sampler(search, src, pad_id=models[0].pad_id, samples=n, steps=steps)
    found = token_by_token(
        models, src[rows], choose, bos_id=bos_id, eos_id=eos_id, search=search,
        steer=steer.rows(rows.tolist()),
    )  # fmt: skip
    return [found[i : i + n] for i in range(0, len(found), n)]


def hypothesis(
    row: list[int], log_prob: float, forced: int, search: SearchConfig, eos_id: int
) -> Hypothesis:
    """An output row (ended by its first ``<eos>``) as a :class:`Hypothesis`; ``forced``
    prefix tokens are not counted in the length normalisation (they cost nothing)."""
    tokens = row[: row.index(eos_id)]
    return Hypothesis(tokens, log_prob / divisor(len(tokens) + 1 - forced, search))


class Sampler:
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
