"""Decode speed (and BLEU) of one model in four engines, side by side.

Engines: ours (torch, :mod:`transformer_mt.inference.search`), ours with ``compute_type=int8``
(the linear layers dynamically quantized), ``transformers`` ``generate`` on the exported model,
CTranslate2 float32 and CTranslate2 int8 (the float32 conversion quantized at load), all on the
same weights and the same thread count.

Without ``--ckpt`` the model is random, of the decode benchmark's size (V 8000, d_model 256,
8 heads, d_ff 1024, 3+3 layers), written by :mod:`transformer_mt.checkpoint` like any other,
decoding a batch of random sources (64 x 16 tokens) for ``--new-tokens`` steps (a random model
practically never picks ``<eos>``; the JSON records the mean output length of each engine to
show that they did the same work: n steps each, which is n - 1 tokens and ``<eos>`` for ours
and ``generate``, n tokens for CTranslate2). With ``--ckpt`` it exports that checkpoint and
translates Multi30k test2016 (``--data-dir``) with every engine, with sacreBLEU per engine.

    python scripts/benchmark.py engines --threads 2
    python scripts/benchmark.py engines --ckpt run/checkpoints/best.ckpt \\
        --data-dir ../shared/data/multi30k --out docs/benchmarks/engines_multi30k_de_en.json

Timings are medians over ``--repeats`` interleaved rounds (every round runs each engine once).
Needs the ``export`` extra (transformers, ctranslate2).
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from bench.common import Table, add_model_arguments, environment, interleaved_times, model_config

NAME = "engines"
HELP = "decode sentences/s (and BLEU) of ours, generate and CTranslate2 fp32/int8"
QUICK = {
    "vocab": 64, "d_model": 32, "n_heads": 4, "d_ff": 64, "layers": 1,
    "batch": 4, "src_len": 6, "new_tokens": 4, "repeats": 1, "beams": [1, 2],
}  # fmt: skip
ENGINES = ("ours", "ours_compiled", "ours_int8", "transformers", "ct2_float32", "ct2_int8")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Options of ``benchmark.py engines``."""
    p.add_argument("--ckpt", help="a trained checkpoint (default: a random model)")
    p.add_argument("--data-dir", help="Multi30k directory, for BLEU on test2016 with --ckpt")
    p.add_argument("--limit", type=int, default=0, help="first N test sentences only")
    p.add_argument("--beams", type=int, nargs="+", default=[1, 5])
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--src-len", type=int, default=16)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--repeats", type=int, default=5)
    add_model_arguments(p)


def synthetic_tokenizer(vocab: int) -> Any:
    """A vocabulary of ``vocab`` made-up tokens (random-model runs need ids, not text)."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import models, pre_tokenizers

    from transformer_mt.data.tokenizer import SPECIAL_TOKENS, Tokenizer

    words = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    words.update({f"w{i}": i for i in range(len(SPECIAL_TOKENS), vocab)})
    hf = HFTokenizer(models.WordLevel(words, unk_token=SPECIAL_TOKENS[3]))
    hf.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return Tokenizer(hf, None, "xx", "yy", {"vocab_size": vocab, "synthetic": True})


def random_checkpoint(args: argparse.Namespace, path: Path) -> Path:
    """A random model of the command line's size, in the project's checkpoint format."""
    from transformer_mt.checkpoint import STATE_PREFIX, save_checkpoint, write_metadata
    from transformer_mt.model.transformer import Transformer

    config = model_config(args, dropout=0.0, max_len=256)
    model = Transformer(config)
    checkpoint: dict[str, Any] = {
        "state_dict": {STATE_PREFIX + k: v for k, v in model.state_dict().items()},
        "global_step": 0,
    }
    tokenizer = synthetic_tokenizer(args.vocab)
    write_metadata(checkpoint, config, tokenizer, decoding={"beam_size": 5, "length_penalty": 0.6})
    return save_checkpoint(checkpoint, path)


def engines(ckpt: Path, work: Path, threads: int) -> dict[str, Any]:
    """Ours, the exported Hugging Face model and CTranslate2 (fp32, int8) of one checkpoint."""
    import transformers

    from transformer_mt.checkpoint import load_model
    from transformer_mt.export.convert import export_ctranslate2, export_huggingface
    from transformer_mt.inference.ctranslate2_engine import CTranslate2Engine
    from transformer_mt.inference.engine import TorchEngine

    loaded = load_model(ckpt)
    hf_dir = export_huggingface(ckpt, work / "hf", force=True)
    ct2_dir = export_ctranslate2(hf_dir, work / "ct2", force=True)
    hf = transformers.AutoModelForSeq2SeqLM.from_pretrained(hf_dir).eval()
    compiled = TorchEngine.from_loaded(loaded, compile=True)
    compiled.warm_up()  # the compile itself stays out of the timings
    return {
        "loaded": loaded,
        "ours_compiled": compiled,
        "ours_int8": TorchEngine.from_loaded(loaded, compute_type="int8"),
        "hf": hf,
        "ct2_float32": CTranslate2Engine(ct2_dir, threads=threads, compute_type="float32"),
        "ct2_int8": CTranslate2Engine(ct2_dir, threads=threads, compute_type="int8"),
    }


# ------------------------------------------------------------------------------ random model


def random_contenders(
    e: dict[str, Any], src: torch.Tensor, beam: int, *, new_tokens: int, batch: int
) -> dict[str, Callable[[], Any]]:
    """One call per engine decoding ``src`` for ``new_tokens`` steps with beam ``beam``."""
    from transformer_mt.inference.search import SearchConfig, generate

    loaded, hf = e["loaded"], e["hf"]
    eos = loaded.tokenizer.eos_id
    # A random model practically never picks <eos> (1 of V tokens), so every engine runs
    # the whole cap of n steps; the JSON records the output lengths to show it.
    search = SearchConfig(beam_size=beam, length_penalty=0.0, max_len_a=0.0, max_len_b=new_tokens)

    def hf_generate() -> Any:
        with torch.no_grad():
            return hf.generate(
                input_ids=src,
                attention_mask=src != 0,
                num_beams=beam,
                max_new_tokens=new_tokens,
                length_penalty=0.0,
                do_sample=False,
            )

    def ct2(name: str) -> Callable[[], Any]:
        engine = e[name]
        tokens = [[engine.tokenizer.src.id_to_token(t) for t in row] for row in src.tolist()]
        return lambda: engine.translator.translate_batch(
            tokens,
            beam_size=beam,
            max_decoding_length=new_tokens,
            length_penalty=0.0,
            max_batch_size=batch,
        )

    int8, steps = e["ours_int8"].models[0], e["ours_compiled"].steps
    return {
        "ours": lambda: generate(loaded.model, src, bos_id=1, eos_id=eos, search=search),
        "ours_compiled": lambda: generate(
            loaded.model, src, bos_id=1, eos_id=eos, search=search, decoding_steps=steps
        ),
        "ours_int8": lambda: generate(int8, src, bos_id=1, eos_id=eos, search=search),
        "transformers": hf_generate,
        "ct2_float32": ct2("ct2_float32"),
        "ct2_int8": ct2("ct2_int8"),
    }


def _mean_length(output: Any, eos: int) -> float:
    """Mean generated tokens per sentence (``<eos>``, start token and padding excluded)."""
    if isinstance(output, torch.Tensor):
        rows = [[t for t in row if t not in (0, 1)] for row in output.tolist()]
        rows = [row[: row.index(eos)] if eos in row else row for row in rows]
    else:  # CTranslate2 results
        rows = [r.hypotheses[0] for r in output]
    return sum(map(len, rows)) / max(len(rows), 1)


def bench_random(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    from transformer_mt.data.tokenizer import SPECIAL_TOKENS

    e = engines(random_checkpoint(args, work / "random.ckpt"), work, args.threads)
    eos = e["loaded"].tokenizer.eos_id
    g = torch.Generator().manual_seed(0)
    src = torch.randint(len(SPECIAL_TOKENS), args.vocab, (args.batch, args.src_len), generator=g)
    src[:, -1] = eos
    results: dict[str, Any] = {}
    for beam in args.beams:
        contenders = random_contenders(e, src, beam, new_tokens=args.new_tokens, batch=args.batch)
        lengths = {name: _mean_length(fn(), eos) for name, fn in contenders.items()}
        times = interleaved_times(contenders, args.repeats, warmup=1)
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
        "config": e["loaded"].config.to_dict(),
        "batch": args.batch,
        "src_len": args.src_len,
        "new_tokens": args.new_tokens,
        "results": results,
    }


# ------------------------------------------------------------------------------ a checkpoint


def hf_translator(
    e: dict[str, Any], ids: list[list[int]], search: Any, batch: int
) -> Callable[[int], list[str]]:
    """``generate`` over the first n sentences, longest first in batches as the others do."""
    loaded, hf = e["loaded"], e["hf"]
    tok = loaded.tokenizer

    def translate(n: int) -> list[str]:
        order = sorted(range(n), key=lambda i: -len(ids[i]))
        out: list[str] = [""] * n
        for i in range(0, n, batch):
            chunk = [ids[k] for k in order[i : i + batch]]
            width = max(len(r) for r in chunk) + 1
            src = torch.zeros(len(chunk), width, dtype=torch.long)
            for j, r in enumerate(chunk):
                src[j, : len(r) + 1] = torch.tensor([*r, tok.eos_id])
            with torch.no_grad():
                gen = hf.generate(
                    input_ids=src,
                    attention_mask=src != 0,
                    num_beams=search.beam_size,
                    length_penalty=search.length_penalty,
                    max_new_tokens=min(  # our cap; positions end at max_len
                        int(search.max_len_a * width + search.max_len_b), loaded.config.max_len
                    ),
                )
            texts = tok.decode_hypotheses([r[1:] for r in gen.tolist()])
            for k, text in zip(order[i : i + batch], texts):
                out[k] = text
        return out

    return translate


def checkpoint_contenders(
    e: dict[str, Any], sources: list[str], beam: int, batch: int
) -> dict[str, Callable[[int], list[str]]]:
    """Engine -> translate the first n sentences of ``sources`` with beam ``beam``."""
    from transformer_mt.inference.search import SearchConfig
    from transformer_mt.inference.translator import Translator

    loaded = e["loaded"]
    known = set(SearchConfig.__dataclass_fields__)
    decoding = {k: v for k, v in loaded.decoding.items() if k in known}
    search = SearchConfig(**{**decoding, "beam_size": beam})
    ours = Translator(loaded, search, max_sentences=batch)
    ids = ours.encode(sources)
    # CTranslate2 through the same decode loop, batches of up to 64 tokens per sentence
    ct2 = {
        name: Translator(loaded, search, batch * 64, engine=e[name])
        for name in ("ct2_float32", "ct2_int8")
    }
    int8 = Translator(loaded, search, max_sentences=batch, engine=e["ours_int8"])
    compiled = Translator(loaded, search, max_sentences=batch, engine=e["ours_compiled"])
    return {
        "ours": lambda n: loaded.tokenizer.decode_hypotheses(ours.translate_ids(ids[:n])),
        "ours_compiled": lambda n: loaded.tokenizer.decode_hypotheses(
            compiled.translate_ids(ids[:n])
        ),
        "ours_int8": lambda n: loaded.tokenizer.decode_hypotheses(int8.translate_ids(ids[:n])),
        "transformers": hf_translator(e, ids, search, batch),
        "ct2_float32": lambda n: ct2["ct2_float32"].translate(sources[:n]),
        "ct2_int8": lambda n: ct2["ct2_int8"].translate(sources[:n]),
    }


def bench_checkpoint(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    import sacrebleu

    from transformer_mt.data.sources.files import iter_lines

    if args.data_dir is None:
        raise ValueError("--ckpt needs --data-dir (Multi30k with test_2016_flickr.*.gz)")
    e = engines(Path(args.ckpt), work, args.threads)
    src_lang, tgt_lang = e["loaded"].src_lang or "en", e["loaded"].tgt_lang or "de"
    sources = list(iter_lines(Path(args.data_dir) / f"test_2016_flickr.{src_lang}.gz"))
    refs = list(iter_lines(Path(args.data_dir) / f"test_2016_flickr.{tgt_lang}.gz"))
    if args.limit:
        sources, refs = sources[: args.limit], refs[: args.limit]
    results: dict[str, Any] = {}
    for beam in args.beams:
        contenders = checkpoint_contenders(e, sources, beam, args.batch)
        outputs: dict[str, list[str]] = {}

        def timed(
            name: str, fn: Callable[[int], list[str]], outputs: dict[str, list[str]] = outputs
        ) -> Callable[[], None]:
            def whole_set() -> None:
                outputs[name] = fn(len(sources))  # identical every round: greedy and beam

            return whole_set

        for fn in contenders.values():
            fn(min(8, len(sources)))  # warm-up: lazy initialisation, allocator, thread pools
        # Each round runs every engine over the whole set, the engines' order rotating, so a
        # machine that drifts over the minutes moves every engine alike.
        times = interleaved_times(
            {name: timed(name, fn) for name, fn in contenders.items()}, args.repeats, warmup=0
        )
        row: dict[str, Any] = {}
        for name, seconds in times.items():
            median = statistics.median(seconds)
            row[name] = {
                "median_s": median,
                "seconds_per_round": seconds,
                "x_generate_per_round": [g / t for g, t in zip(times["transformers"], seconds)],
                "sentences_per_s": len(sources) / median,
                "bleu": sacrebleu.corpus_bleu(outputs[name], [refs]).score,
            }
        results[f"beam{beam}"] = row
    return {"model": str(args.ckpt), "sentences": len(sources), "results": results}


def run(args: argparse.Namespace) -> dict[str, Any]:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        result = bench_checkpoint(args, work) if args.ckpt else bench_random(args, work)
    result["environment"] = environment()
    return result


def tables(result: dict[str, Any]) -> list[Table]:
    beams = [b for b in result["results"] if not b.endswith("_output_tokens")]
    first = next(iter(result["results"][beams[0]].values()))
    has_bleu, has_rounds = "bleu" in first, "x_generate_per_round" in first
    header = ["engine"] + [f"{b} sent/s" for b in beams] + [f"{b} x generate" for b in beams]
    if has_rounds:
        header += [f"{b} x gen. rounds" for b in beams]
    if has_bleu:
        header += [f"{b} BLEU" for b in beams]
    rows = []
    for name in ENGINES:
        rows_of = [result["results"][b][name] for b in beams]
        speeds = [r["sentences_per_s"] for r in rows_of]
        base = [result["results"][b]["transformers"]["sentences_per_s"] for b in beams]
        cells = [name] + [f"{s:.1f}" for s in speeds]
        cells += [f"{s / g:.2f}" for s, g in zip(speeds, base)]
        if has_rounds:
            cells += [
                f"{min(r['x_generate_per_round']):.2f}-{max(r['x_generate_per_round']):.2f}"
                for r in rows_of
            ]
        if has_bleu:
            cells += [f"{r['bleu']:.2f}" for r in rows_of]
        rows.append(cells)
    return [(f"Decode engines ({result['model']} model)", header, rows)]
