"""Corpus-level translation metrics with sacreBLEU, on detokenized text.

BLEU is computed the standard way (cased, the 13a tokenizer, exponential smoothing), so a
score is comparable with published sacreBLEU numbers; ``bleu_lc`` is the lowercased variant
(closer to the lowercased, tokenized BLEU that many tutorials report); chrF is character
n-gram F-score (Popović, 2015).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import sacrebleu


@dataclass
class Scores:
    bleu: float
    bleu_lc: float
    chrf: float
    bleu_signature: str
    chrf_signature: str
    n_sentences: int

    def to_dict(self) -> dict[str, float | str | int]:
        return asdict(self)


def corpus_scores(hypotheses: Sequence[str], references: Sequence[str]) -> Scores:
    """Score detokenized hypotheses against one reference each."""
    if len(hypotheses) != len(references):
        raise ValueError(
            f"{len(hypotheses)} hypotheses but {len(references)} references; they must align"
        )
    hyps, refs = list(hypotheses), [list(references)]
    bleu = sacrebleu.metrics.BLEU()
    bleu_lc = sacrebleu.metrics.BLEU(lowercase=True)
    chrf = sacrebleu.metrics.CHRF()
    b = bleu.corpus_score(hyps, refs)
    return Scores(
        bleu=float(b.score),
        bleu_lc=float(bleu_lc.corpus_score(hyps, refs).score),
        chrf=float(chrf.corpus_score(hyps, refs).score),
        bleu_signature=str(bleu.get_signature()),
        chrf_signature=str(chrf.get_signature()),
        n_sentences=len(hyps),
    )


def oracle_choice(nbest: Sequence[Sequence[str]], references: Sequence[str]) -> list[str]:
    """Per sentence, the n-best hypothesis with the highest sentence BLEU against its reference.

    The corpus BLEU of the choices is the usual "oracle BLEU" of an n-best list: how far
    reranking the list could go. Choosing per sentence only approximates the best corpus BLEU
    (BLEU does not add over sentences). Ties keep the better-ranked hypothesis.
    """
    if len(nbest) != len(references):
        raise ValueError(
            f"{len(nbest)} n-best lists but {len(references)} references; they must align"
        )
    bleu = sacrebleu.metrics.BLEU(effective_order=True)
    choices = []
    for hyps, ref in zip(nbest, references):
        scores = [bleu.sentence_score(h, [ref]).score for h in hyps]
        choices.append(hyps[scores.index(max(scores))])
    return choices
