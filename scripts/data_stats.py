"""Padding efficiency of token-budget batching vs random-order batching.

Tokenizes a corpus with the project's pipeline (byte-level BPE trained on its
training split) and reports, for each ``--max-tokens``, the share of real
(non-pad) tokens in the padded source+target tensors of one training epoch:

* ``token_budget``: length-sorted buckets (what the DataModule uses);
* ``random_order``: the same budget over examples in random order.

Usage (from the project root)::

    python scripts/data_stats.py --dir ../shared/data/multi30k --out outputs/data_stats.json
    python scripts/data_stats.py --source generated --vocab-size 512
"""

from __future__ import annotations

import argparse
import json
import logging
import tempfile
import time
from pathlib import Path

import numpy as np

from transformer_mt.data.batching import TokenBudgetBatchSampler, pack_by_budget, padding_efficiency
from transformer_mt.data.config import DataConfig
from transformer_mt.data.prepare import prepare

log = logging.getLogger("data_stats")


def random_order_batches(
    src_lengths: np.ndarray, tgt_lengths: np.ndarray, max_tokens: int, seed: int = 0
) -> list[np.ndarray]:
    """Baseline for comparison: the same budget, examples in random order."""
    src_lengths, tgt_lengths = np.asarray(src_lengths), np.asarray(tgt_lengths)
    order = np.random.default_rng(seed).permutation(len(src_lengths))
    return pack_by_budget(order, np.maximum(src_lengths, tgt_lengths), max_tokens)


def measure(src: np.ndarray, tgt: np.ndarray, max_tokens: int, seed: int) -> dict[str, float]:
    """Efficiency, batch count and mean batch size for both strategies."""
    sampler = TokenBudgetBatchSampler(src, tgt, max_tokens, shuffle=True, seed=seed)
    bucketed = sampler.batches()
    shuffled = random_order_batches(src, tgt, max_tokens, seed=seed)
    return {
        "max_tokens": max_tokens,
        "token_budget_efficiency": padding_efficiency(bucketed, src, tgt),
        "token_budget_batches": len(bucketed),
        "token_budget_mean_sentences": float(np.mean([len(b) for b in bucketed])),
        "random_order_efficiency": padding_efficiency(shuffled, src, tgt),
        "random_order_batches": len(shuffled),
        "random_order_mean_sentences": float(np.mean([len(b) for b in shuffled])),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--source", default="files", choices=["files", "generated"])
    parser.add_argument("--dir", default="../shared/data/multi30k")
    parser.add_argument("--src-lang", default="en")
    parser.add_argument("--tgt-lang", default="de")
    parser.add_argument("--vocab-size", type=int, default=8000)
    parser.add_argument("--max-len", type=int, default=256)
    parser.add_argument("--max-tokens", type=int, nargs="+", default=[1024, 2048, 4096, 8192])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("outputs/data_stats.json"))
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")

    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as work_dir:
        data = prepare(
            DataConfig(
                source=args.source,
                dir=args.dir if args.source == "files" else None,
                src_lang=args.src_lang,
                tgt_lang=args.tgt_lang,
                vocab_size=args.vocab_size,
                max_len=args.max_len,
                max_tokens=max(max(args.max_tokens), args.max_len + 2),
                eval_max_tokens=None,
                seed=args.seed,
            ),
            work_dir=work_dir,
        )
    src_ids, tgt_ids = data.lengths["train"]  # filtered to max_len: tensor lengths add specials
    src, tgt = src_ids + 1, tgt_ids + 2
    results = {
        "corpus": args.dir if args.source == "files" else "generated numbers",
        "pair": f"{args.src_lang}-{args.tgt_lang}",
        "vocab_size": data.tokenizer.src_vocab_size,
        "train_pairs": len(src),
        "mean_src_len": float(src.mean()),
        "mean_tgt_len": float(tgt.mean()),
        "max_src_len": int(src.max()),
        "max_tgt_len": int(tgt.max()),
        "setup_seconds": round(time.perf_counter() - start, 2),
        "budgets": [measure(src, tgt, m, args.seed) for m in args.max_tokens],
    }
    print(
        f"{results['corpus']} {results['pair']}: {len(src)} training pairs, lengths incl. specials"
    )
    print(f"{'max_tokens':>10} {'bucketed':>9} {'batches':>8} {'random':>8} {'batches':>8}")
    for row in results["budgets"]:
        print(
            f"{row['max_tokens']:>10} {row['token_budget_efficiency']:>9.1%} "
            f"{row['token_budget_batches']:>8} {row['random_order_efficiency']:>8.1%} "
            f"{row['random_order_batches']:>8}"
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    log.info("Wrote %s", args.out)


if __name__ == "__main__":
    main()
