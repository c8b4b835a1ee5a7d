"""Corpus-level translation metrics with sacreBLEU, on detokenized text.

BLEU is computed the standard way (cased, the 13a tokenizer, exponential smoothing), so a
score is comparable with published sacreBLEU numbers; ``bleu_lc`` is the lowercased variant
(closer to the lowercased, tokenized BLEU that many tutorials report); chrF is character
n-gram F-score (Popović, 2015).

``bleu_tok`` is the literature's Multi30k yardstick (multi-bleu style): hypothesis and reference
are lowercased, Moses punctuation-normalised and Moses-tokenised for the target language (the
dataset's scripts/task1-tokenize.sh, here with ``sacremoses``), then scored with no further
tokenization. Published Multi30k scores (e.g. Wu et al., 2021) are on this scale; it is not
comparable with cased sacreBLEU, which stays the headline.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from functools import lru_cache
from importlib.metadata import version

import sacrebleu
from sacremoses import MosesPunctNormalizer, MosesTokenizer


@dataclass
class Scores:
    bleu: float
    bleu_lc: float
    chrf: float
    bleu_tok: float
    bleu_signature: str
    chrf_signature: str
    bleu_tok_signature: str
    n_sentences: int

    def to_dict(self) -> dict[str, float | str | int]:
        return asdict(self)


@lru_cache(maxsize=16)
def _moses(lang: str) -> tuple[MosesPunctNormalizer, MosesTokenizer]:
    return MosesPunctNormalizer(lang=lang), MosesTokenizer(lang=lang)


def moses_tokenize(lines: Sequence[str], lang: str) -> list[str]:
    """Lowercase, normalise punctuation and Moses-tokenise, as Multi30k's ``tok/`` files are.

    The order (lowercase, then normalise, then tokenise, escaping ``& < > " '`` as entities)
    is the dataset's task1-tokenize.sh; a test holds the output to its official files.
    """
    normalizer, tokenizer = _moses(lang)
    return [
        tokenizer.tokenize(normalizer.normalize(line.lower()), escape=True, return_str=True).strip()
        for line in lines
    ]


def bleu_tok_signature(lang: str) -> str:
    """How ``bleu_tok`` was computed, in sacreBLEU's signature style."""
    return (
        f"nrefs:1|case:lc|tok:moses-norm-tok-{lang}|smooth:exp"
        f"|sacremoses:{version('sacremoses')}|version:{sacrebleu.__version__}"
    )


def corpus_scores(hypotheses: Sequence[str], references: Sequence[str], *, lang: str) -> Scores:
    """Score detokenized hypotheses against one reference each, in target language ``lang``."""
    if len(hypotheses) != len(references):
        raise ValueError(
            f"{len(hypotheses)} hypotheses but {len(references)} references; they must align"
        )
    hyps, refs = list(hypotheses), [list(references)]
    bleu = sacrebleu.metrics.BLEU()
    bleu_lc = sacrebleu.metrics.BLEU(lowercase=True)
    chrf = sacrebleu.metrics.CHRF()
    b = bleu.corpus_score(hyps, refs)
    # force: the input is tokenized on purpose, which sacreBLEU would otherwise warn about.
    bleu_tok = sacrebleu.metrics.BLEU(tokenize="none", force=True).corpus_score(
        moses_tokenize(hyps, lang), [moses_tokenize(references, lang)]
    )
    return Scores(
        bleu=float(b.score),
        bleu_lc=float(bleu_lc.corpus_score(hyps, refs).score),
        chrf=float(chrf.corpus_score(hyps, refs).score),
        bleu_tok=float(bleu_tok.score),
        bleu_signature=str(bleu.get_signature()),
        chrf_signature=str(chrf.get_signature()),
        bleu_tok_signature=bleu_tok_signature(lang),
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
