"""Measure word alignments on the embedded number task, where the aligned words are known.

    python scripts/alignment_check.py --ckpt RUN/checkpoints/last.ckpt [--sentences 500]

The number task's names, nouns, places and days have one known translation each (Anna -> Anna,
apples -> Äpfel, garden -> Garten, Monday -> Montag). For generated sentence pairs, every such
word that appears once on each side is an anchor ``(i, j)``. The checkpoint's alignment of the
source to the reference (a teacher-forced pass, :mod:`transformer_mt.inference.alignment`) is
scored for every decoder layer and both readings of the query position:

- recall: the share of anchors linked;
- precision: of the links from an anchor's output word, the share that point to its source word.

Prints a table and writes JSON (``--json``). The checkpoint must be an en->de (or en->fr)
number-task model, e.g. ``python train.py`` with the defaults.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path

from transformer_mt.checkpoint import load_model
from transformer_mt.data.numbers import DAYS, NAMES, NOUNS, PLACES, number_sentences
from transformer_mt.inference.alignment import cross_attention, piece_words, word_alignment
from transformer_mt.inference.translator import Translator

PUNCTUATION = ".,;:!?"


def lexicon(tgt_lang: str) -> dict[str, str]:
    """English word -> its one translation, for the words whose translation is one word."""
    column = {"de": 1, "fr": 2}[tgt_lang]
    pairs = {name: name for name in NAMES}
    for row in [*NOUNS, *PLACES, *DAYS]:
        en, other = row[0].split()[-1], row[column].split()[-1]
        pairs[en] = other
    return pairs


def anchors(src: str, tgt: str, words: dict[str, str]) -> list[tuple[int, int]]:
    """``(i, j)`` of the lexicon words that appear once in ``src`` and their translation once
    in ``tgt`` (punctuation stripped, case kept)."""
    s = [w.strip(PUNCTUATION) for w in src.split()]
    t = [w.strip(PUNCTUATION) for w in tgt.split()]
    found = []
    for i, word in enumerate(s):
        other = words.get(word)
        if other and s.count(word) == 1 and t.count(other) == 1:
            found.append((i, t.index(other)))
    return found


def score(links: list[list[tuple[int, int]]], gold: list[list[tuple[int, int]]]) -> dict:
    hit = total = right = linked = 0
    for pairs, anchor_pairs in zip(links, gold):
        for i, j in anchor_pairs:
            total += 1
            hit += (i, j) in pairs
            from_j = [a for a, b in pairs if b == j]
            linked += len(from_j)
            right += from_j.count(i)
    return {
        "anchors": total,
        "recall": round(100 * hit / max(total, 1), 2),
        "precision": round(100 * right / max(linked, 1), 2),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ckpt", required=True)
    parser.add_argument("--sentences", type=int, default=500)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--json", type=Path, help="write the table here as JSON")
    args = parser.parse_args(argv)
    loaded = load_model(args.ckpt, "cpu")
    if loaded.src_lang != "en" or loaded.tgt_lang not in ("de", "fr"):
        print(
            f"error: {args.ckpt} translates {loaded.src_lang}->{loaded.tgt_lang}; give an "
            "en->de or en->fr number-task checkpoint",
            file=sys.stderr,
        )
        return 2
    numbers = list(range(1, args.sentences + 1))
    src, tgt = number_sentences(numbers, "en", loaded.tgt_lang, seed=args.seed)
    words = lexicon(loaded.tgt_lang)
    gold = [anchors(s, t, words) for s, t in zip(src, tgt)]
    translator = Translator(loaded)
    tok = loaded.tokenizer
    src_ids, tgt_ids = translator.encode(src), tok.encode_tgt_batch(tgt)
    rows = []
    for layer in range(len(loaded.model.decoder.layers)):
        for shift in (0, 1):
            links: dict[int, list[tuple[int, int]]] = {}
            for batch in translator.batches(src_ids, tgt_ids):
                weights = cross_attention(loaded.model, batch["src"], batch["tgt"][:, :-1], layer)
                for b, index in enumerate(batch["index"].tolist()):
                    links[index] = word_alignment(
                        weights[b],
                        piece_words([tok.src.id_to_token(i) for i in src_ids[index]]),
                        piece_words([tok.tgt.id_to_token(i) for i in tgt_ids[index]]),
                        shift,
                    )
            found = [links[i] for i in range(len(src))]
            rows.append({"layer": layer, "shift": shift, **score(found, gold)})
    print(
        f"{args.ckpt} ({platform.processor() or platform.machine()}), "
        f"{len(src)} sentences, seed {args.seed}"
    )
    print("| decoder layer | query position | anchors | recall % | precision % |")
    print("|---|---|---|---|---|")
    for r in rows:
        where = "after the piece (its input)" if r["shift"] else "predicting it"
        print(f"| {r['layer']} | {where} | {r['anchors']} | {r['recall']} | {r['precision']} |")
    if args.json:
        args.json.write_text(json.dumps({"ckpt": args.ckpt, "rows": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
