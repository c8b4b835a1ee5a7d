"""Word alignments from cross-attention, in the Pharaoh ``i-j`` format.

An output's alignment links source word ``i`` to output word ``j`` (both counted from 0 over
the words a user sees: runs of characters between spaces, tabs and line breaks). One
teacher-forced pass of the model over the source and its output records the cross-attention
of one decoder layer (:data:`ALIGNMENT_LAYER`), averaged over its heads. BPE pieces are merged
into words by summing: a source word's weight is the sum over its pieces, an output word's
weights the sum over the queries of its pieces; each output word then links to the source word
it weighs most (one link per output word, as a markup transfer needs).

An output piece is read at the decoder position that predicts it (:data:`ALIGNMENT_SHIFT`).
The layer and the position were chosen on the embedded number task, whose names, nouns,
places and days have known translations, and by agreement with eflomal on Multi30k
(``scripts/alignment_check.py``; docs/evaluation.md). With a cached
decoder the weights are the same as a teacher-forced pass's, so the pass gives the alignment of
the search's own attention.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import cache

import torch
from torch import Tensor

from transformer_mt.model.attention import record_attention_weights
from transformer_mt.model.transformer import Transformer

#: The decoder layer whose cross-attention aligns (negative: counted from the last): the
#: second-to-last, or the only one of a one-layer decoder.
ALIGNMENT_LAYER = -2
#: Output piece ``t`` is read at decoder position ``t + ALIGNMENT_SHIFT`` (0: the query that
#: predicts it; 1: the one where it is the input).
ALIGNMENT_SHIFT = 0

_WORD = re.compile(rb"[^ \t\r\n\f\v]+")


@cache
def _byte_of_char() -> dict[str, int]:
    """Byte-level BPE's alphabet: the character that stands for each byte, inverted.

    Printable bytes stand for themselves; the others (space, control bytes, ...) were moved to
    the characters from U+0100 on, in byte order.
    """
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars = {b: b for b in printable}
    moved = 0
    for b in range(256):
        if b not in chars:
            chars[b] = 256 + moved
            moved += 1
    return {chr(c): b for b, c in chars.items()}


def piece_words(pieces: Sequence[str | None]) -> list[int | None]:
    """The index of the word each byte-level BPE piece falls in (``None``: a special token
    or only whitespace). A word runs between spaces, tabs and line breaks."""
    table = _byte_of_char()
    spans, text = [], b""
    for piece in pieces:
        data = bytes(table[c] for c in piece if c in table) if piece is not None else b""
        spans.append((len(text), len(text) + len(data)))
        text += data
    words = [m.span() for m in _WORD.finditer(text)]
    out: list[int | None] = []
    w = 0
    for start, end in spans:
        while w < len(words) and words[w][1] <= start:
            w += 1
        inside = w < len(words) and words[w][0] < end and start < end
        out.append(w if inside else None)
    return out


def cross_attention(
    model: Transformer, src: Tensor, tgt_in: Tensor, layer: int = ALIGNMENT_LAYER
) -> Tensor:
    """The head-averaged cross-attention of decoder layer ``layer``, ``(B, T, S)``, of a
    teacher-forced pass over ``src (B, S)`` and ``tgt_in (B, T)`` (``<bos>`` + output)."""
    n = len(model.decoder.layers)
    index = range(n)[layer] if -n <= layer < n else (0 if layer < 0 else n - 1)
    with torch.no_grad(), record_attention_weights(model) as records:
        model(src, tgt_in)
    return records[f"decoder.layers.{index}.cross_attn"][0].float().mean(dim=1)


def word_alignment(
    weights: Tensor,
    src_words: Sequence[int | None],
    out_words: Sequence[int | None],
    shift: int = ALIGNMENT_SHIFT,
) -> list[tuple[int, int]]:
    """Pharaoh pairs ``(i, j)`` from one sentence's attention ``weights (T, S)``: one per
    output word, sorted by output word.

    ``weights[t + shift]`` is the query read for output piece ``t`` (module docstring);
    ``src_words``/``out_words`` give each source and output piece's word
    (:func:`piece_words`).
    """
    n_words = max((w for w in src_words if w is not None), default=-1) + 1
    if n_words == 0:
        return []
    # Each source word's attention is the sum over its pieces.
    member = torch.zeros(len(src_words), n_words)
    for s, w in enumerate(src_words):
        if w is not None:
            member[s, w] = 1.0
    by_word = weights[:, : len(src_words)].float() @ member  # (T, words)
    rows: dict[int, torch.Tensor] = {}
    for t, j in enumerate(out_words):
        if j is not None and t + shift < weights.size(0):
            rows[j] = rows.get(j, 0) + by_word[t + shift]
    return [(int(rows[j].argmax()), j) for j in sorted(rows)]


def pharaoh(pairs: Sequence[tuple[int, int]]) -> str:
    """``0-0 1-2 ...``: the Pharaoh format of alignment pairs."""
    return " ".join(f"{i}-{j}" for i, j in pairs)
