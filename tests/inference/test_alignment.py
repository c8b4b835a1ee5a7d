"""Word alignments: BPE pieces to words, the per-word link, and a check that can fail."""

from __future__ import annotations

import torch

from transformer_mt.inference.alignment import (
    cross_attention,
    pharaoh,
    piece_words,
    word_alignment,
)

from conftest import source_tensor, train_copy_model


def test_pieces_fall_in_the_words_between_whitespace() -> None:
    # "Ich weiß, dass Äpfel" in byte-level pieces: Ä is two bytes (Ã Ħ), "Ġ" a space.
    pieces = ["Ich", "Ġwei", "ÃŁ", ",", "Ġdass", "Ġ", "Ã", "Ħ", "pfel", None]
    assert piece_words(pieces) == [0, 1, 1, 1, 2, None, 3, 3, 3, None]
    assert piece_words(["Ġ", "Ġ"]) == [None, None]
    assert piece_words([]) == []


def test_each_output_word_links_to_the_source_word_it_weighs_most() -> None:
    # 3 source pieces (words 0, 0, 1) + <eos>; 3 output pieces (words 0, 1, 1) + <eos>.
    weights = torch.tensor(
        [
            [0.3, 0.3, 0.4, 0.0],  # piece 0: word 0 sums 0.6 > 0.4
            [0.1, 0.1, 0.7, 0.1],  # pieces 1-2 (word 1) sum to word 0: 0.5, word 1: 1.0
            [0.3, 0.1, 0.3, 0.3],
            [0.0, 0.0, 0.0, 1.0],
        ]
    )
    pairs = word_alignment(weights, [0, 0, 1], [0, 1, 1], shift=0)
    assert pairs == [(0, 0), (1, 1)]
    assert pharaoh(pairs) == "0-0 1-1"
    # Read one query later, the pieces see other rows.
    assert word_alignment(weights, [0, 0, 1], [0, 1, 1], shift=1) == [(1, 0), (0, 1)]


def test_a_copy_model_aligns_each_word_to_itself() -> None:
    """A model that copies its source has a known alignment, the diagonal. The copy model is
    small and trained for seconds, so its attention is blurred; the chosen query position must
    still find the diagonal for a large share of words, far more often than reading one position
    later (the number task's check, scripts/alignment_check.py, is the sharp measurement)."""
    torch.manual_seed(0)
    tokenizer, model = train_copy_model()
    from transformer_mt.data.numbers import number_sentences

    texts, _ = number_sentences(list(range(1001, 1061)), "en", "de", seed=5)
    src = source_tensor(tokenizer, texts)
    tgt_in = torch.cat([torch.ones_like(src[:, :1]), src[:, :-1]], dim=1)  # <bos> + copy
    tgt_in[tgt_in == tokenizer.eos_id] = tokenizer.pad_id
    weights = cross_attention(model, src, tgt_in)
    rows = tokenizer.encode_batch(texts)
    hits = {0: 0, 1: 0}
    total = 0
    for b, ids in enumerate(rows):
        words = piece_words([tokenizer.src.id_to_token(i) for i in ids])
        total += len(set(w for w in words if w is not None))
        for shift in hits:
            pairs = word_alignment(weights[b], words, words, shift=shift)
            hits[shift] += sum(i == j for i, j in pairs)
    assert hits[0] / total > 0.4, (hits, total)
    assert hits[0] > 1.5 * hits[1], (hits, total)
