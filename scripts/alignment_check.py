"""Measure word alignments where they can be checked: the number task, and against eflomal.

    python scripts/alignment_check.py numbers --ckpt RUN/checkpoints/last.ckpt [--sentences 500]
    python scripts/alignment_check.py multi30k --ckpt CKPT [--split test_2016_flickr]

``numbers``: the number task's names, nouns, places and days have one known translation each
(Anna -> Anna, apples -> Äpfel, garden -> Garten, Monday -> Montag). For generated sentence
pairs, every such word that appears once on each side is an anchor ``(i, j)``; the checkpoint
(an en->de or en->fr number-task model, e.g. ``python train.py`` with the defaults) is scored by
recall (the share of anchors linked) and precision (of the links from an anchor's output word,
the share that point to its source word).

``multi30k``: Multi30k has no gold alignment, so ours is compared with eflomal's (Östling &
Tiedemann 2016; ``pip install eflomal``) on the split's references: precision, recall and AER
against eflomal's two directions (see :func:`multi30k_check`).

Both align each source line to its reference (a teacher-forced pass,
:mod:`transformer_mt.inference.alignment`), for every decoder layer and both readings of the
query position; they print a table and write JSON (``--json``).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path

from transformer_mt.checkpoint import load_model
from transformer_mt.data.numbers import DAYS, NAMES, NOUNS, PLACES, number_sentences
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


def our_links(loaded, src: list[str], tgt: list[str], layer: int, shift: int) -> list[list]:
    """The checkpoint's alignment of each source line to its reference (teacher-forced)."""
    translator = Translator(loaded)
    references = loaded.tokenizer.encode_tgt_batch(tgt)
    return translator.align(translator.encode(src), references, layer=layer, shift=shift)


def numbers_check(loaded, args: argparse.Namespace) -> tuple[str, list[dict]]:
    if loaded.src_lang != "en" or loaded.tgt_lang not in ("de", "fr"):
        raise SystemExit(
            f"error: {args.ckpt} translates {loaded.src_lang}->{loaded.tgt_lang}; give an "
            "en->de or en->fr number-task checkpoint"
        )
    numbers = list(range(1, args.sentences + 1))
    src, tgt = number_sentences(numbers, "en", loaded.tgt_lang, seed=args.seed)
    words = lexicon(loaded.tgt_lang)
    gold = [anchors(s, t, words) for s, t in zip(src, tgt)]
    rows = [
        {"layer": layer, "shift": shift, **score(our_links(loaded, src, tgt, layer, shift), gold)}
        for layer in range(len(loaded.model.decoder.layers))
        for shift in (0, 1)
    ]
    return f"number task, {len(src)} generated sentences, seed {args.seed}", rows


def multi30k_check(loaded, args: argparse.Namespace) -> tuple[str, list[dict]]:
    """Agreement with eflomal (pip install eflomal) on a Multi30k split's references.

    eflomal aligns the training set and the split together (lowercased words); its two
    directions' intersection is the sure set S, their union the possible set P. Ours is
    scored by precision against P, recall against S and the alignment error rate
    AER = 1 - (|A & S| + |A & P|) / (|A| + |S|) (Och & Ney 2003).
    """
    import gzip
    import tempfile

    try:
        import eflomal
    except ImportError:
        raise SystemExit("error: the Multi30k check needs eflomal; pip install eflomal") from None
    data = Path(args.multi30k)
    s, t = loaded.src_lang, loaded.tgt_lang

    def read(name: str) -> list[str]:
        with gzip.open(data / name, "rt", encoding="utf-8") as handle:
            return [line.rstrip("\n") for line in handle]

    src, tgt = read(f"{args.split}.{s}.gz"), read(f"{args.split}.{t}.gz")
    train_src, train_tgt = read(f"train.{s}.gz"), read(f"train.{t}.gz")
    with tempfile.TemporaryDirectory() as tmp:
        fwd, rev = Path(tmp) / "fwd", Path(tmp) / "rev"
        eflomal.Aligner().align(
            [line.lower() for line in [*train_src, *src]],
            [line.lower() for line in [*train_tgt, *tgt]],
            links_filename_fwd=str(fwd),
            links_filename_rev=str(rev),
        )
        keep = slice(len(train_src), None)
        forward = [_pairs(line) for line in fwd.read_text().splitlines()[keep]]
        reverse = [_pairs(line) for line in rev.read_text().splitlines()[keep]]
    rows = []
    for layer in range(len(loaded.model.decoder.layers)):
        for shift in (0, 1):
            ours = our_links(loaded, src, tgt, layer, shift)
            rows.append({"layer": layer, "shift": shift, **aer(ours, forward, reverse)})
    return f"Multi30k {args.split} {s}-{t} references, {len(src)} sentences, vs eflomal", rows


def _pairs(line: str) -> set[tuple[int, int]]:
    return {tuple(map(int, p.split("-"))) for p in line.split()}


def aer(ours: list, forward: list, reverse: list) -> dict:
    a_total = s_total = a_s = a_p = 0
    for mine, f, r in zip(ours, forward, reverse):
        a, sure, possible = set(mine), f & r, f | r
        a_total, s_total = a_total + len(a), s_total + len(sure)
        a_s, a_p = a_s + len(a & sure), a_p + len(a & possible)
    return {
        "links": a_total,
        "precision": round(100 * a_p / max(a_total, 1), 2),
        "recall": round(100 * a_s / max(s_total, 1), 2),
        "aer": round(100 * (1 - (a_s + a_p) / max(a_total + s_total, 1)), 2),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("check", choices=("numbers", "multi30k"))
    parser.add_argument("--ckpt", required=True)
    parser.add_argument("--sentences", type=int, default=500, help="numbers: sentences")
    parser.add_argument("--seed", type=int, default=7, help="numbers: generator seed")
    parser.add_argument("--multi30k", default="../shared/data/multi30k", help="raw Multi30k dir")
    parser.add_argument("--split", default="test_2016_flickr", help="multi30k: the split")
    parser.add_argument("--json", type=Path, help="write the table here as JSON")
    args = parser.parse_args(argv)
    loaded = load_model(args.ckpt, "cpu")
    check = numbers_check if args.check == "numbers" else multi30k_check
    title, rows = check(loaded, args)
    print(f"{args.ckpt}: {title}; {platform.processor() or platform.machine()}")
    columns = [k for k in rows[0] if k not in ("layer", "shift")]
    print("| decoder layer | query position | " + " | ".join(columns) + " |")
    print("|---|---|" + "---|" * len(columns))
    for r in rows:
        where = "where it is the input" if r["shift"] else "predicting it"
        values = " | ".join(str(r[c]) for c in columns)
        print(f"| {r['layer']} | {where} | {values} |")
    if args.json:
        args.json.write_text(json.dumps({"ckpt": args.ckpt, "check": title, "rows": rows}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
