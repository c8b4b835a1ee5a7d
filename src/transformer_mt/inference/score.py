"""Score given translations with a checkpoint (forced decoding).

:func:`score_pairs` gives each target's per-token log-probabilities given its source, where the
tokens count the target's subwords and ``<eos>``. Pairs are batched by the decode loop's batcher
and scored by the same engine interface as translation (:mod:`transformer_mt.inference.decode`),
so the score of a translation equals the score beam search reported for it (length penalty 0);
an ensemble scores with the models' averaged log-probabilities. A side longer than the model
takes (the checkpoint's ``data.max_len``, or its positional ``max_len`` - 1) is an error naming
the line, or is cut with a warning (``truncate``). The command: :mod:`transformer_mt.cli.score`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from transformer_mt.errors import SettingError
from transformer_mt.inference.translator import Translator

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PairScore:
    """The score of one target given its source: per-token log-probabilities, ``<eos>`` last."""

    token_log_probs: list[float]
    tokens: list[str]

    @property
    def total(self) -> float:
        return sum(self.token_log_probs)

    @property
    def mean(self) -> float:
        return self.total / len(self.token_log_probs)


def score_pairs(
    translator: Translator,
    sources: Sequence[str],
    targets: Sequence[str],
    *,
    truncate: bool = False,
    progress: bool = False,
) -> list[PairScore]:
    """Score each target given its source, in order.

    Raises:
        ValueError: the two sides differ in length, or (without ``truncate``) a side is
            longer than the model takes; the message names the line.
    """
    if len(sources) != len(targets):
        raise ValueError(
            f"{len(sources)} sources but {len(targets)} targets; the two sides must have one "
            "line per pair"
        )
    tok = translator.tokenizer
    src_ids = tok.encode_src_batch([s.strip() for s in sources])
    if translator.tag_id is not None:  # a multilingual model: the target tag leads the source
        src_ids = [[translator.tag_id, *ids] for ids in src_ids]
    tgt_ids = tok.encode_tgt_batch([t.strip() for t in targets])
    src_ids, tgt_ids = _fit(src_ids, tgt_ids, translator.limit, truncate)
    scores = translator.score_ids(src_ids, tgt_ids, progress=progress)
    vocab = tok.tgt
    return [
        PairScore(lps, [*(vocab.id_to_token(t) for t in ids), vocab.id_to_token(tok.eos_id)])
        for lps, ids in zip(scores, tgt_ids)
    ]


def _fit(
    src_ids: list[list[int]], tgt_ids: list[list[int]], limit: int | None, truncate: bool
) -> tuple[list[list[int]], list[list[int]]]:
    """Both sides within ``limit`` ids: refused with the line named, or cut with a warning."""
    if limit is None:
        return src_ids, tgt_ids
    long = [i for i, (s, t) in enumerate(zip(src_ids, tgt_ids)) if max(len(s), len(t)) > limit]
    if long and not truncate:
        i = long[0]
        raise SettingError(
            f"pair {i + 1} has {len(src_ids[i])} source and {len(tgt_ids[i])} target tokens, "
            f"more than the {limit} the model takes (data.max_len, or its max_len - 1)",
            [("truncate", True)],
            lead="shorten it, or set",
            tail="to score the first tokens",
        )
    if long:
        log.warning(
            "%d pairs longer than %d tokens were truncated (first: line %d)",
            len(long),
            limit,
            long[0] + 1,
        )
    return [s[:limit] for s in src_ids], [t[:limit] for t in tgt_ids]


def format_score(score: PairScore, with_tokens: bool) -> str:
    """``total<TAB>tokens<TAB>mean`` (+ ``<TAB>per-token scores<TAB>subwords``)."""
    line = f"{score.total:.4f}\t{len(score.token_log_probs)}\t{score.mean:.4f}"
    if with_tokens:
        per_token = " ".join(f"{lp:.4f}" for lp in score.token_log_probs)
        line += f"\t{per_token}\t{' '.join(score.tokens)}"
    return line + "\n"
