"""Write a large synthetic parallel corpus as files, to test data loading at WMT scale.

    python scripts/make_large_corpus.py /tmp/big --pairs 1000000
    python train.py data=files data.dir=/tmp/big data.src_lang=en data.tgt_lang=de

Spelling out a million numbers with ``num2words`` takes minutes, so this spells a
few tens of thousands (:func:`transformer_mt.data.numbers.number_sentences`) and
builds each training pair by joining two to three of those sentences at random:
about 24 source words a pair, close to WMT14's average (~23), and practically no
duplicates. Validation and test use numbers the training set never contains.

Output (``--format parallel``, the Multi30k/WMT layout of ``configs/data/files.yaml``)::

    DIR/train.en DIR/train.de   --pairs lines
    DIR/val.en   DIR/val.de     --eval-pairs lines
    DIR/test.en  DIR/test.de    --eval-pairs lines

DIR must be new or empty, so no corpus of the user's is ever replaced (nor shadowed: the
loader reads ``train.en`` before ``train.en.gz``); a directory this script wrote (it leaves
``.make_large_corpus`` in it) is written again with ``--force``.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

import numpy as np

from transformer_mt.data.numbers import number_sentences

log = logging.getLogger("make_large_corpus")

#: Left in every directory this script writes: only those may be written again (--force).
MARKER = ".make_large_corpus"


def check_out_dir(out_dir: Path, force: bool) -> str | None:
    """Why ``out_dir`` may not be written (one line with the fix), or None."""
    if out_dir.exists() and not out_dir.is_dir():
        return f"{out_dir} is a file; give a new directory"
    if not out_dir.exists() or not any(out_dir.iterdir()):
        return None
    if not (out_dir / MARKER).is_file():
        return (
            f"{out_dir} is not empty and was not written by make_large_corpus.py; its files "
            "would be replaced (or shadow its .gz corpora): give a new directory"
        )
    if not force:
        return f"{out_dir} holds a corpus this script wrote; pass --force to write it again"
    return None


def base_sentences(
    numbers: np.ndarray, src_lang: str, tgt_lang: str, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """One template sentence pair per number, as numpy string arrays (cheap to index)."""
    src, tgt = number_sentences(numbers, src_lang, tgt_lang, seed=seed)
    return np.asarray(src, dtype=object), np.asarray(tgt, dtype=object)


def write_combined(
    directory: Path,
    prefix: str,
    langs: tuple[str, str],
    src: np.ndarray,
    tgt: np.ndarray,
    pairs: int,
    rng: np.random.Generator,
    max_parts: int = 3,
    chunk: int = 100_000,
) -> int:
    """Write ``pairs`` lines joining 2..max_parts random base pairs; return bytes written."""
    paths = [directory / f"{prefix}.{lang}" for lang in langs]
    with (
        open(paths[0], "w", encoding="utf-8") as out_src,
        open(paths[1], "w", encoding="utf-8") as out_tgt,
    ):
        for start in range(0, pairs, chunk):
            n = min(chunk, pairs - start)
            parts = rng.integers(2, max_parts + 1, size=n)
            picks = rng.integers(0, len(src), size=(n, max_parts))
            for k, row in zip(parts.tolist(), picks.tolist()):
                chosen = row[:k]
                out_src.write(" ".join(src[chosen]) + "\n")
                out_tgt.write(" ".join(tgt[chosen]) + "\n")
    return sum(p.stat().st_size for p in paths)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--pairs", type=int, default=1_000_000, help="training pairs")
    parser.add_argument("--eval-pairs", type=int, default=3000, help="validation/test pairs")
    parser.add_argument("--base", type=int, default=40_000, help="numbers spelled for training")
    parser.add_argument("--src-lang", default="en")
    parser.add_argument("--tgt-lang", default="de")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--force", action="store_true", help="rewrite a corpus it wrote before")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    problem = check_out_dir(args.out_dir, args.force)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        raise SystemExit(2)

    started = time.perf_counter()
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / MARKER).write_text("written by scripts/make_large_corpus.py\n")
    rng = np.random.default_rng(args.seed)
    # Disjoint numbers: training from the first block, evaluation from the rest.
    numbers = 2 + rng.choice(999_998, size=args.base + 2 * args.eval_pairs, replace=False)
    train_numbers = numbers[: args.base]
    langs = (args.src_lang, args.tgt_lang)
    src, tgt = base_sentences(train_numbers, *langs, seed=args.seed)
    log.info("spelled %d base sentences in %.1fs", len(src), time.perf_counter() - started)
    size = write_combined(args.out_dir, "train", langs, src, tgt, args.pairs, rng)
    log.info("train: %d pairs, %.1f MB", args.pairs, size / 1e6)
    for i, prefix in enumerate(("val", "test")):
        chosen = numbers[args.base + i * args.eval_pairs : args.base + (i + 1) * args.eval_pairs]
        e_src, e_tgt = base_sentences(chosen, *langs, seed=args.seed + 1 + i)
        write_combined(args.out_dir, prefix, langs, e_src, e_tgt, args.eval_pairs, rng)
    log.info("wrote %s in %.1fs", args.out_dir, time.perf_counter() - started)


if __name__ == "__main__":
    main()
