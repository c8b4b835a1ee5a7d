"""Steered decoding against plain decoding: sampling, prefixes and constraints, side by side.

On one checkpoint and one test set (``--source``/``--reference``, e.g. Multi30k test2016):

- **sampling** (``--nbest 5`` samples per sentence at ``--topk``/``--temperature``) against
  greedy: sentences/s, and the diversity of the samples: distinct outputs per sentence and
  self-BLEU (the mean BLEU of each sample against the sentence's other samples; lower is more
  diverse), and the BLEU of the first sample;
- **constraints** against unconstrained beam search of the same width: one or two nouns of each
  reference (German writes nouns capitalised: a capitalised word after the first, punctuation
  stripped), drawn with ``--seed``; the share of outputs that contain all their phrases, BLEU
  and sentences/s;
- **a prefix**: the reference's first ``--prefix-words`` words forced, greedy; BLEU and
  sentences/s against plain greedy.

    python scripts/benchmark.py steer --ckpt run/checkpoints/best.ckpt \\
        --source test_2016_flickr.en --reference test_2016_flickr.de

Timings are medians over ``--repeats`` interleaved rounds of the whole set; BLEU is sacreBLEU
(cased, 13a) of the 1-best.
"""

from __future__ import annotations

import argparse
import gzip
import random
import statistics
from pathlib import Path
from typing import Any

from bench.common import Table, environment, interleaved_times, median

NAME = "steer"
HELP = "sampling, prefixes and constraints vs greedy and beam: speed, diversity, BLEU"
QUICK = {"limit": 16, "repeats": 1}


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Options of ``benchmark.py steer``."""
    p.add_argument("--ckpt", required=True, help="a trained checkpoint")
    p.add_argument("--source", required=True, help="source sentences (text or .gz)")
    p.add_argument("--reference", required=True, help="references, line-aligned (text or .gz)")
    p.add_argument("--limit", type=int, default=0, help="first N sentences only")
    p.add_argument("--beam", type=int, default=5)
    p.add_argument("--nbest", type=int, default=5, help="samples per sentence")
    p.add_argument("--topk", type=int, default=20)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--prefix-words", type=int, default=2)
    p.add_argument("--seed", type=int, default=1, help="draws the constraints; seeds sampling")
    p.add_argument("--repeats", type=int, default=3)


def read(path: str, limit: int) -> list[str]:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as handle:
        lines = [line.rstrip("\n") for line in handle]
    return lines[:limit] if limit else lines


def reference_nouns(reference: str, rng: random.Random) -> list[str]:
    """One or two capitalised words after the first (nouns, in German), in sentence order."""
    words = [w.strip(".,;:!?\"'()") for w in reference.split()[1:]]
    nouns = sorted({w for w in words if w[:1].isupper()}, key=words.index)
    if not nouns:
        return []
    return sorted(rng.sample(nouns, min(len(nouns), rng.choice((1, 2)))), key=words.index)


def self_bleu(samples: list[list[str]]) -> float:
    """Mean sentence BLEU of each sample against the other samples of its sentence."""
    import sacrebleu

    scores = []
    for group in samples:
        for i, hyp in enumerate(group):
            others = group[:i] + group[i + 1 :]
            if others:
                scores.append(sacrebleu.sentence_bleu(hyp, others).score)
    return statistics.fmean(scores) if scores else float("nan")


def run(args: argparse.Namespace) -> dict[str, Any]:
    import sacrebleu

    from transformer_mt.checkpoint import load_model
    from transformer_mt.inference.search import SearchConfig
    from transformer_mt.inference.translator import Translator

    sources, references = read(args.source, args.limit), read(args.reference, args.limit)
    loaded = load_model(args.ckpt, "cpu")
    translator = Translator(loaded)
    rng = random.Random(args.seed)
    constraints = [reference_nouns(r, rng) for r in references]
    prefixes = [" ".join(r.split()[: args.prefix_words]) for r in references]
    base = SearchConfig.from_stored(loaded.decoding)
    greedy = SearchConfig.from_stored(loaded.decoding, beam_size=1)
    beam = SearchConfig.from_stored(loaded.decoding, beam_size=args.beam)
    sampling = SearchConfig.from_stored(
        loaded.decoding, sampling_topk=args.topk, temperature=args.temperature,
        nbest=args.nbest, seed=args.seed,
    )  # fmt: skip
    runs = {
        "greedy": lambda: translator.translate_batch(sources, greedy),
        "sampling": lambda: translator.translate_batch(sources, sampling),
        "prefix": lambda: translator.translate_batch(sources, greedy, prefixes=prefixes),
        "beam": lambda: translator.translate_batch(sources, beam),
        "constrained": lambda: translator.translate_batch(sources, beam, constraints=constraints),
    }
    outputs = {name: fn() for name, fn in runs.items()}
    times = interleaved_times(runs, args.repeats, warmup=0)
    results: dict[str, Any] = {}
    for name, translations in outputs.items():
        texts = [t.text for t in translations]
        results[name] = {
            "sentences_per_s": round(len(sources) / median(times[name]), 2),
            "bleu": round(sacrebleu.corpus_bleu(texts, [references]).score, 2),
            "times_s": [round(t, 4) for t in times[name]],
        }
    samples = [[h.text for h in t.hypotheses] for t in outputs["sampling"]]
    results["sampling"].update(
        distinct_per_sentence=round(statistics.fmean(len(set(s)) for s in samples), 3),
        self_bleu=round(self_bleu(samples), 2),
    )
    with_phrases = [c for c in constraints if c]
    met = sum(
        all(p in t.text for p in c)
        for t, c in zip(outputs["constrained"], constraints)
        if c
    )  # fmt: skip
    results["constrained"].update(
        sentences_with_constraints=len(with_phrases),
        satisfied=met,
        satisfied_percent=round(100 * met / max(len(with_phrases), 1), 2),
    )
    results["prefix"]["starts_with_prefix"] = sum(
        t.text.startswith(p) for t, p in zip(outputs["prefix"], prefixes)
    )
    return {
        "settings": {
            **{k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
            "stored_decoding": str(base),
        },
        "sentences": len(sources),
        "example_constraints": constraints[:5],
        "results": results,
        "environment": environment(),
    }


def tables(result: dict[str, Any]) -> list[Table]:
    r, n = result["results"], result["sentences"]
    s = result["settings"]
    header = ["decoding", "sentences/s", "x its baseline", "BLEU", "notes"]
    rows = [
        [
            "greedy",
            f"{r['greedy']['sentences_per_s']:.1f}",
            "1.00",
            f"{r['greedy']['bleu']:.2f}",
            "",
        ],
        [
            f"sampling top-k {s['topk']}, T {s['temperature']}, {s['nbest']} samples",
            f"{r['sampling']['sentences_per_s']:.1f}",
            f"{r['sampling']['sentences_per_s'] / r['greedy']['sentences_per_s']:.2f}",
            f"{r['sampling']['bleu']:.2f}",
            f"{r['sampling']['distinct_per_sentence']:.2f} distinct of {s['nbest']}, "
            f"self-BLEU {r['sampling']['self_bleu']:.1f}",
        ],
        [
            f"greedy, reference's first {s['prefix_words']} words forced",
            f"{r['prefix']['sentences_per_s']:.1f}",
            f"{r['prefix']['sentences_per_s'] / r['greedy']['sentences_per_s']:.2f}",
            f"{r['prefix']['bleu']:.2f}",
            f"{r['prefix']['starts_with_prefix']}/{n} start with it",
        ],
        [
            f"beam {s['beam']}",
            f"{r['beam']['sentences_per_s']:.1f}",
            "1.00",
            f"{r['beam']['bleu']:.2f}",
            "",
        ],
        [
            f"beam {s['beam']}, 1-2 reference nouns required",
            f"{r['constrained']['sentences_per_s']:.1f}",
            f"{r['constrained']['sentences_per_s'] / r['beam']['sentences_per_s']:.2f}",
            f"{r['constrained']['bleu']:.2f}",
            f"{r['constrained']['satisfied']}/{r['constrained']['sentences_with_constraints']} "
            "contain every phrase",
        ],
    ]
    return [(f"Steered decoding, {n} sentences ({Path(s['ckpt']).name})", header, rows)]
