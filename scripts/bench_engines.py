"""Decode speed (and BLEU) of one model in four engines, side by side.

Engines: ours (torch, :mod:`transformer_mt.inference.search`), ``transformers`` ``generate`` on
the exported model, CTranslate2 float32 and CTranslate2 int8 (the float32 conversion quantized
at load), all on the same weights and the same thread count.

Without ``--ckpt`` the model is random, of the decode benchmark's size (V 8000, d_model 256,
8 heads, d_ff 1024, 3+3 layers), decoding a batch of random sources (64 x 16 tokens) for
``--new-tokens`` steps (a random model practically never picks ``<eos>``; the JSON records
the mean output length of each engine to show that they did the same work: n steps each, which
is n - 1 tokens and ``<eos>`` for ours and ``generate``, n tokens for CTranslate2). With
``--ckpt`` it exports that checkpoint, and with ``--data-dir`` it also translates Multi30k
test2016 with every engine and reports sacreBLEU per engine.

    python scripts/bench_engines.py --threads 2 --out bench_engines.json
    python scripts/bench_engines.py --ckpt run/checkpoints/best.ckpt \\
        --data-dir ../shared/data/multi30k --out bench_engines_multi30k.json

Timings are medians over ``--repeats`` interleaved rounds (every round runs each engine once).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from transformer_mt.checkpoint import CHECKPOINT_KEY, load_model, save_checkpoint
from transformer_mt.data.tokenizer import SPECIAL_TOKENS, Tokenizer
from transformer_mt.inference.export import export_ctranslate2, export_huggingface
from transformer_mt.inference.export_ctranslate2 import CTranslate2Translator
from transformer_mt.inference.search import SearchConfig, generate
from transformer_mt.model.transformer import ModelConfig, Transformer

ENGINES = ("ours", "transformers", "ct2_float32", "ct2_int8")


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def synthetic_tokenizer(vocab: int) -> Tokenizer:
    """A vocabulary of ``vocab`` made-up tokens (random-model runs need ids, not text)."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import models, pre_tokenizers

    words = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    words.update({f"w{i}": i for i in range(len(SPECIAL_TOKENS), vocab)})
    hf = HFTokenizer(models.WordLevel(words, unk_token=SPECIAL_TOKENS[3]))
    hf.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return Tokenizer(hf, None, "xx", "yy", {"vocab_size": vocab, "synthetic": True})


def random_checkpoint(args: argparse.Namespace, path: Path) -> Path:
    config = ModelConfig(
        src_vocab_size=args.vocab,
        tgt_vocab_size=args.vocab,
        d_model=args.d_model,
        n_heads=args.n_heads,
        d_ff=args.d_ff,
        n_encoder_layers=args.layers,
        n_decoder_layers=args.layers,
        dropout=0.0,
        max_len=256,
    )
    model = Transformer(config)
    checkpoint = {
        "state_dict": {f"model.{k}": v for k, v in model.state_dict().items()},
        "global_step": 0,
        CHECKPOINT_KEY: {
            "format": 1,
            "model_config": config.to_dict(),
            "tokenizer": synthetic_tokenizer(args.vocab).to_json(),
            "decoding": {"beam_size": 5, "length_penalty": 0.6},
        },
    }
    return save_checkpoint(checkpoint, path)


def timed(contenders: dict[str, Callable[[], Any]], repeats: int) -> dict[str, list[float]]:
    """Seconds per call, one warm-up call each, then ``repeats`` interleaved rounds."""
    for fn in contenders.values():
        fn()
    times: dict[str, list[float]] = {name: [] for name in contenders}
    names = list(contenders)
    for r in range(repeats):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            start = time.perf_counter()
            contenders[name]()
            times[name].append(time.perf_counter() - start)
    return times


def engines(ckpt: Path, work: Path, threads: int) -> dict[str, Any]:
    """Ours, the exported Hugging Face model and CTranslate2 (fp32, int8) of one checkpoint."""
    import transformers

    loaded = load_model(ckpt)
    hf_dir = export_huggingface(ckpt, work / "hf", force=True)
    ct2_dir = export_ctranslate2(hf_dir, work / "ct2", force=True)
    hf = transformers.AutoModelForSeq2SeqLM.from_pretrained(hf_dir).eval()
    return {
        "loaded": loaded,
        "hf": hf,
        "ct2_float32": CTranslate2Translator(ct2_dir, threads=threads, compute_type="float32"),
        "ct2_int8": CTranslate2Translator(ct2_dir, threads=threads, compute_type="int8"),
    }


def bench_random(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    ckpt = random_checkpoint(args, work / "random.ckpt")
    e = engines(ckpt, work, args.threads)
    loaded, hf = e["loaded"], e["hf"]
    g = torch.Generator().manual_seed(0)
    src = torch.randint(len(SPECIAL_TOKENS), args.vocab, (args.batch, args.src_len), generator=g)
    src[:, -1] = loaded.tokenizer.eos_id
    rows = src[:, :-1].tolist()
    eos = loaded.tokenizer.eos_id
    n = args.new_tokens
    results: dict[str, Any] = {}
    for beam in args.beams:
        # A random model practically never picks <eos> (1 of V tokens), so every engine runs
        # the whole cap of n steps; the JSON records the output lengths to show it.
        search = SearchConfig(beam_size=beam, length_penalty=0.0, max_len_a=0.0, max_len_b=n)

        def ours(search: SearchConfig = search) -> Any:
            return generate(loaded.model, src, 1, eos, search)

        def hf_generate(beam: int = beam) -> Any:
            with torch.no_grad():
                return hf.generate(
                    input_ids=src,
                    attention_mask=src != 0,
                    num_beams=beam,
                    max_new_tokens=n,
                    length_penalty=0.0,
                    do_sample=False,
                )

        def ct2(name: str, beam: int = beam) -> Callable[[], Any]:
            engine = e[name]
            tokens = [[engine.tokenizer.src.id_to_token(t) for t in [*r, eos]] for r in rows]

            def run() -> Any:
                return engine.translator.translate_batch(
                    tokens,
                    beam_size=beam,
                    max_decoding_length=n,
                    length_penalty=0.0,
                    max_batch_size=args.batch,
                )

            return run

        contenders = {
            "ours": ours,
            "transformers": hf_generate,
            "ct2_float32": ct2("ct2_float32"),
            "ct2_int8": ct2("ct2_int8"),
        }
        lengths = {name: _mean_length(fn(), eos) for name, fn in contenders.items()}
        times = timed(contenders, args.repeats)
        results[f"beam{beam}_output_tokens"] = lengths
        results[f"beam{beam}"] = {
            name: {
                "median_s": statistics.median(t),
                "sentences_per_s": args.batch / statistics.median(t),
            }
            for name, t in times.items()
        }
    return {
        "model": "random",
        "config": loaded.config.to_dict(),
        "batch": args.batch,
        "src_len": args.src_len,
        "new_tokens": n,
        "results": results,
    }


def _mean_length(output: Any, eos: int) -> float:
    """Mean generated tokens per sentence (``<eos>``, start token and padding excluded)."""
    if isinstance(output, torch.Tensor):
        rows = [[t for t in row if t not in (0, 1)] for row in output.tolist()]
        rows = [row[: row.index(eos)] if eos in row else row for row in rows]
    else:  # CTranslate2 results
        rows = [r.hypotheses[0] for r in output]
    return sum(map(len, rows)) / max(len(rows), 1)


def read_lines(path: Path) -> list[str]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f]


def bench_checkpoint(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    import sacrebleu

    from transformer_mt.inference.translate import Translator

    e = engines(Path(args.ckpt), work, args.threads)
    loaded, hf = e["loaded"], e["hf"]
    src_lang, tgt_lang = loaded.src_lang or "en", loaded.tgt_lang or "de"
    if args.data_dir is None:
        raise SystemExit("error: --ckpt needs --data-dir (Multi30k with test_2016_flickr.*.gz)")
    sources = read_lines(Path(args.data_dir) / f"test_2016_flickr.{src_lang}.gz")
    refs = read_lines(Path(args.data_dir) / f"test_2016_flickr.{tgt_lang}.gz")
    if args.limit:
        sources, refs = sources[: args.limit], refs[: args.limit]
    tok = loaded.tokenizer
    ids = Translator(loaded).encode(sources)
    results: dict[str, Any] = {}
    for beam in args.beams:
        base = SearchConfig(**{**_decoding(loaded.decoding), "beam_size": beam})
        ours = Translator(loaded, base, max_sentences=args.batch)

        def hf_translate(n: int, beam: int = beam, search: SearchConfig = base) -> list[str]:
            order = sorted(range(n), key=lambda i: -len(ids[i]))  # as the others batch
            out: list[str] = [""] * n
            for i in range(0, n, args.batch):
                chunk = [ids[k] for k in order[i : i + args.batch]]
                width = max(len(r) for r in chunk) + 1
                src = torch.zeros(len(chunk), width, dtype=torch.long)
                for j, r in enumerate(chunk):
                    src[j, : len(r) + 1] = torch.tensor([*r, tok.eos_id])
                with torch.no_grad():
                    gen = hf.generate(
                        input_ids=src,
                        attention_mask=src != 0,
                        num_beams=beam,
                        length_penalty=search.length_penalty,
                        max_new_tokens=min(  # our cap; positions end at max_len
                            int(search.max_len_a * width + search.max_len_b),
                            loaded.config.max_len,
                        ),
                    )
                texts = tok.decode_hypotheses([r[1:] for r in gen.tolist()])
                for k, text in zip(order[i : i + args.batch], texts):
                    out[k] = text
            return out

        for name in ("ct2_float32", "ct2_int8"):
            e[name].search = base
            e[name].max_tokens = args.batch * 64
        # Each takes the number of leading sentences to translate.
        contenders: dict[str, Callable[[int], list[str]]] = {
            "ours": lambda n, ours=ours: tok.decode_hypotheses(ours.translate_ids(ids[:n])),
            "transformers": hf_translate,
            "ct2_float32": lambda n: e["ct2_float32"].translate(sources[:n]),
            "ct2_int8": lambda n: e["ct2_int8"].translate(sources[:n]),
        }
        row: dict[str, Any] = {}
        for name, fn in contenders.items():
            fn(min(8, len(sources)))  # warm-up: lazy initialisation, allocator, thread pools
            start = time.perf_counter()
            hyps = fn(len(sources))
            elapsed = time.perf_counter() - start
            bleu = sacrebleu.corpus_bleu(hyps, [refs])
            row[name] = {
                "seconds": elapsed,
                "sentences_per_s": len(sources) / elapsed,
                "bleu": bleu.score,
            }
        results[f"beam{beam}"] = row
    return {"model": str(args.ckpt), "sentences": len(sources), "results": results}


def _decoding(decoding: dict[str, Any]) -> dict[str, Any]:
    known = set(SearchConfig.__dataclass_fields__)
    return {k: v for k, v in decoding.items() if k in known}


def table(result: dict[str, Any]) -> str:
    beams = [b for b in result["results"] if not b.endswith("_output_tokens")]
    has_bleu = "bleu" in next(iter(result["results"][beams[0]].values()))
    header = ["engine"] + [f"{b} sent/s" for b in beams] + [f"{b} x generate" for b in beams]
    if has_bleu:
        header += [f"{b} BLEU" for b in beams]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for name in ENGINES:
        cells = [name]
        speeds = [result["results"][b][name]["sentences_per_s"] for b in beams]
        base = [result["results"][b]["transformers"]["sentences_per_s"] for b in beams]
        cells += [f"{s:.1f}" for s in speeds] + [f"{s / g:.2f}" for s, g in zip(speeds, base)]
        if has_bleu:
            cells += [f"{result['results'][b][name]['bleu']:.2f}" for b in beams]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ckpt", help="a trained checkpoint (default: a random model)")
    p.add_argument("--data-dir", help="Multi30k directory, for BLEU on test2016 with --ckpt")
    p.add_argument("--limit", type=int, default=0, help="first N test sentences only")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--beams", type=int, nargs="+", default=[1, 5])
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--src-len", type=int, default=16)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--vocab", type=int, default=8000)
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--n-heads", type=int, default=8)
    p.add_argument("--d-ff", type=int, default=1024)
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out", type=Path, help="write the result as JSON here")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        result = bench_checkpoint(args, work) if args.ckpt else bench_random(args, work)
    result["environment"] = {
        "cpu": cpu_model(),
        "threads": args.threads,
        "torch": torch.__version__,
        "load_average": list(os.getloadavg()),
        "time": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    print(f"CPU: {result['environment']['cpu']}, {args.threads} threads")
    print(table(result))
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
