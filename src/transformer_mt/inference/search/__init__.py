"""Greedy search, beam search and sampling over the decoder's key/value cache, for one model or
an ensemble; :func:`search_batch` picks one for a batch.

Read in this order: :mod:`.settings` (what a search is asked for and returns),
:mod:`.decoder` (the models' state over the cache, length caps, forced prefixes),
:mod:`.greedy` (the token-by-token loop: greedy and sampling), :mod:`.beam` (beam search) and
:mod:`.constraints` (lexical constraints, a beam of their own). :mod:`.cancel` lets a caller
stop a search between two steps.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from transformer_mt.errors import SettingError
from transformer_mt.inference.search.beam import Beam, beam_search
from transformer_mt.inference.search.cancel import DecodingCancelled, check_stop, stop_when
from transformer_mt.inference.search.constraints import ConstrainedBeam
from transformer_mt.inference.search.decoder import as_models, output_caps
from transformer_mt.inference.search.greedy import greedy_search, sample
from transformer_mt.inference.search.settings import (
    LENGTH_NORMS,
    SAMPLING_KEYS,
    Hypothesis,
    SearchConfig,
    Steering,
    length_penalty,
)
from transformer_mt.model.transformer import Transformer

__all__ = [
    "LENGTH_NORMS",
    "SAMPLING_KEYS",
    "DecodingCancelled",
    "Hypothesis",
    "SearchConfig",
    "Steering",
    "as_models",
    "beam_search",
    "check_stop",
    "greedy_search",
    "length_penalty",
    "output_caps",
    "sample",
    "search_batch",
    "stop_when",
]


def search_batch(
    model: Transformer | Sequence[Transformer],
    src: Tensor,
    *,
    bos_id: int,
    eos_id: int,
    search: SearchConfig,
    steer: Steering | None = None,
) -> list[list[Hypothesis]]:
    """The ``search.nbest`` outputs per sentence: sampled, greedy (``beam_size`` 1) or beam
    search. Sentences with constraint phrases take the constrained beam; the others in the
    batch are searched as if they had none."""
    steer = steer or Steering()
    constrained = [b for b, phrases in enumerate(steer.constraints or ()) if phrases]
    if search.sampling and constrained:
        raise SettingError(
            "constraints need a beam search, but the search samples", [("beam_size", 5)],
            lead="leave out the sampling options and search with e.g.",
        )  # fmt: skip
    if not constrained:
        if search.sampling:
            fn = sample
        elif search.beam_size == 1:
            fn = greedy_search
        else:
            fn = beam_search
        return fn(model, src, bos_id=bos_id, eos_id=eos_id, search=search, steer=steer)
    plain = [b for b in range(src.size(0)) if b not in set(constrained)]
    out: list[list[Hypothesis]] = [[] for _ in range(src.size(0))]
    for rows, beam_type in ((constrained, ConstrainedBeam), (plain, Beam)):
        if not rows:
            continue
        index = torch.tensor(rows, device=src.device)
        found = beam_search(
            model, src[index], bos_id=bos_id, eos_id=eos_id, search=search,
            steer=steer.rows(rows), beam_type=beam_type,
        )  # fmt: skip
        for row, hyps in zip(rows, found):
            out[row] = hyps
    return out
