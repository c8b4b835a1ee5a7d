"""Several translation directions in one model: names, target-language tags, the mix.

``data.directions=[de-en,fr-en,cs-en]`` trains one model for each pair. Every source sentence
starts with the tag of the language to translate into (``<2en>``, ``<2de>``; Johnson et al.,
2017), a special token of the joint vocabulary. The tag goes on the source, not as the
decoder's first token: the encoder then knows the target language from the first layer on,
the decoder's start token stays ``<bos>`` for every direction, so greedy, beam and steered
search, the KV cache, scoring and the exported models (a Hugging Face tokenizer's special
token, a CTranslate2 source token) need nothing new; the one change is the source row.

The training set is every direction's training pairs together, proportional to their sizes
(each pair once per epoch; Multi30k's four languages have the same 29,000 sentences, so its
directions are equally represented), and token-budget batches mix directions.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

#: A direction ``src-tgt``: two language codes (letters, digits, ``_``) joined by ``-``.
_DIRECTION = re.compile(r"^([A-Za-z0-9_]+)-([A-Za-z0-9_]+)$")
#: The source/target language of a model whose directions do not share one.
MULTIPLE = "mul"


def tag(lang: str) -> str:
    """The target-language tag: ``<2de>`` for German."""
    return f"<2{lang}>"


def parse_directions(values: Sequence[str]) -> list[tuple[str, str]]:
    """``["en-de", "en-fr"]`` -> ``[("en", "de"), ("en", "fr")]``, checked.

    Raises:
        ValueError: a malformed or repeated direction, or one into its own language.
    """
    pairs: list[tuple[str, str]] = []
    for value in values:
        match = _DIRECTION.match(str(value).strip())
        if match is None:
            raise ValueError(
                f"data.directions entry {value!r} is not src-tgt; write e.g. "
                '"data.directions=[en-de,en-fr]"'
            )
        pair = (match.group(1), match.group(2))
        if pair[0] == pair[1]:
            raise ValueError(f"data.directions entry {value!r} translates a language into itself")
        if pair in pairs:
            raise ValueError(f"data.directions names {value!r} twice; list each direction once")
        pairs.append(pair)
    return pairs


def name(pair: tuple[str, str]) -> str:
    return f"{pair[0]}-{pair[1]}"


def summary_languages(pairs: Sequence[tuple[str, str]]) -> tuple[str, str]:
    """The ``(src_lang, tgt_lang)`` of a multilingual model: the shared language, else
    :data:`MULTIPLE` (many-to-English is ``("mul", "en")``)."""
    sources = {s for s, _ in pairs}
    targets = {t for _, t in pairs}
    src = next(iter(sources)) if len(sources) == 1 else MULTIPLE
    tgt = next(iter(targets)) if len(targets) == 1 else MULTIPLE
    return src, tgt


def target_languages(pairs: Sequence[tuple[str, str]]) -> list[str]:
    """The target languages, in the order the directions name them."""
    seen: list[str] = []
    for _, t in pairs:
        if t not in seen:
            seen.append(t)
    return seen
