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
Each engine family runs in a process of its own (torch: ours, int8 and ``generate``;
CTranslate2: fp32 and int8), and the rounds alternate between them, one process working at a
time: in one process, torch and CTranslate2 each slow the other down once the other has
translated (docs/benchmarks.md). ``--one-process`` puts every engine in one process, as the
benchmark did before, to measure that interference. Needs the ``export`` extra (transformers,
ctranslate2).
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
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
#: The engines by the library they run on; each family gets a process of its own.
FAMILIES = {
    "torch": ("ours", "ours_int8", "transformers"),
    "ctranslate2": ("ct2_float32", "ct2_int8"),
}
ENGINES = tuple(name for names in FAMILIES.values() for name in names)


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
    p.add_argument(
        "--one-process",
        action="store_true",
        help="every engine in one process (torch and CTranslate2 then slow each other)",
    )
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


def exports(ckpt: Path, work: Path) -> tuple[Path, Path]:
    """The checkpoint exported for ``generate`` and converted for CTranslate2 (fp32)."""
    from transformer_mt.export.convert import export_ctranslate2, export_huggingface

    hf_dir = export_huggingface(ckpt, work / "hf", force=True)
    return hf_dir, export_ctranslate2(hf_dir, work / "ct2", force=True)


def engines(
    families: tuple[str, ...], ckpt: Path, hf_dir: Path, ct2_dir: Path, threads: int
) -> dict[str, Any]:
    """The engines of ``families`` (keys of :data:`FAMILIES`) on one checkpoint, and the
    loaded checkpoint itself; CTranslate2 is imported only where its family is asked for."""
    from transformer_mt.checkpoint import load_model
    from transformer_mt.inference.engine import TorchEngine

    loaded = load_model(ckpt)
    e: dict[str, Any] = {"loaded": loaded}
    if "torch" in families:
        import transformers

        # generate warns at every call that our cap overrides the exported max_length
        transformers.logging.set_verbosity_error()
        e["hf"] = transformers.AutoModelForSeq2SeqLM.from_pretrained(hf_dir).eval()
        e["ours_int8"] = TorchEngine.from_loaded(loaded, compute_type="int8")
    if "ctranslate2" in families:
        from transformer_mt.inference.ctranslate2_engine import CTranslate2Engine

        for kind in ("float32", "int8"):
            e[f"ct2_{kind}"] = CTranslate2Engine(ct2_dir, threads=threads, compute_type=kind)
    return e


# ------------------------------------------------------------------------------ the workers


def _worker(conn: Any, families: tuple[str, ...], spec: dict[str, Any]) -> None:
    """One process's engines: build them, then answer the parent's requests until ``None``.

    Requests: ``("beam", b)`` builds and warms up the contenders for beam ``b``; ``("run",
    name)`` times one of them and answers its seconds; ``("output", name)`` answers what its
    last run produced (the translations, or a random model's mean output length).
    """
    import traceback

    from bench.common import setup_torch
    from transformer_mt.cli.allocator import keep_freed_memory

    keep_freed_memory()  # as the benchmark's own process does
    setup_torch(spec["threads"])
    try:
        e = engines(families, spec["ckpt"], spec["hf_dir"], spec["ct2_dir"], spec["threads"])
        conn.send(("ok", None))
    except Exception:
        conn.send(("error", traceback.format_exc()))
        return
    contenders: dict[str, Callable[[], Any]] = {}
    last: dict[str, Any] = {}
    while (request := conn.recv()) is not None:
        op, arg = request
        try:
            if op == "beam":
                contenders, warm_ups = _contenders(e, spec, arg)
                for name, warm_up in warm_ups.items():  # lazy initialisation, allocator, pools
                    last[name] = warm_up()
                reply: Any = None
            elif op == "run":
                start = time.perf_counter()
                last[arg] = contenders[arg]()
                reply = time.perf_counter() - start
            else:
                reply = last[arg]
            conn.send(("ok", reply))
        except Exception:
            conn.send(("error", traceback.format_exc()))


def _contenders(
    e: dict[str, Any], spec: dict[str, Any], beam: int
) -> tuple[dict[str, Callable[[], Any]], dict[str, Callable[[], Any]]]:
    """Zero-argument calls, each one engine's unit of work answering what the parent reads of
    it (a random model's mean output length, or the translations), and their warm-ups."""
    if spec["mode"] == "random":
        src = torch.tensor(spec["src"])
        eos = e["loaded"].tokenizer.eos_id
        calls = random_contenders(e, src, beam, new_tokens=spec["new_tokens"], batch=spec["batch"])
        timed = {name: (lambda fn=fn: _mean_length(fn(), eos)) for name, fn in calls.items()}
        return timed, timed  # the warm-up is a whole call, and it gives the output length
    sources = spec["sources"]
    translate = checkpoint_contenders(e, sources, beam, spec["batch"])
    n, few = len(sources), min(8, len(sources))
    return (
        {name: (lambda fn=fn: fn(n)) for name, fn in translate.items()},
        {name: (lambda fn=fn: fn(few)) for name, fn in translate.items()},
    )


class Workers:
    """One worker process per engine family (or one for all with ``one_process``); each
    request goes to the process that holds the engine, and waits for its answer, so that one
    process works at a time."""

    def __init__(self, spec: dict[str, Any], one_process: bool = False) -> None:
        import multiprocessing

        context = multiprocessing.get_context("spawn")  # no forked copy of torch's threads
        groups = [tuple(FAMILIES)] if one_process else [(f,) for f in FAMILIES]
        self.conns: dict[str, Any] = {}
        self.processes = []
        for group in groups:  # all load and compile at once; nothing is timed yet
            conn, child = context.Pipe()
            process = context.Process(target=_worker, args=(child, group, spec), daemon=True)
            process.start()
            child.close()
            self.processes.append(process)
            for family in group:
                for name in FAMILIES[family]:
                    self.conns[name] = conn
        try:
            for conn in dict.fromkeys(self.conns.values()):
                self._answer(conn)
        except BaseException:
            self.close()
            raise

    @staticmethod
    def _answer(conn: Any) -> Any:
        try:
            kind, value = conn.recv()
        except EOFError:
            raise RuntimeError("an engine worker exited without answering") from None
        if kind == "error":
            raise RuntimeError(f"an engine worker failed:\n{value}")
        return value

    def call(self, op: str, arg: str | int, conn: Any = None) -> Any:
        """Send ``(op, arg)`` to ``conn``, by default the process holding engine ``arg``."""
        conn = conn or self.conns[str(arg)]
        conn.send((op, arg))
        return self._answer(conn)

    def prepare(self, beam: int) -> None:
        """Every process builds and warms up its contenders for beam ``beam``."""
        for conn in dict.fromkeys(self.conns.values()):
            self.call("beam", beam, conn)

    def close(self) -> None:
        for conn in dict.fromkeys(self.conns.values()):
            with contextlib.suppress(OSError):
                conn.send(None)
        for process in self.processes:
            process.join(30)
            if process.is_alive():
                process.terminate()


def timed_rounds(workers: Workers, repeats: int) -> dict[str, list[float]]:
    """``repeats`` rounds of every engine, each timed in its own process, in rotating order."""
    return interleaved_times(
        {name: (lambda name=name: workers.call("run", name)) for name in ENGINES},
        repeats,
        warmup=0,
        self_timed=True,
    )


# ------------------------------------------------------------------------------ random model


def random_contenders(
    e: dict[str, Any], src: torch.Tensor, beam: int, *, new_tokens: int, batch: int
) -> dict[str, Callable[[], Any]]:
    """One call per engine decoding ``src`` for ``new_tokens`` steps with beam ``beam``."""
    from bench.common import generate
    from transformer_mt.inference.search import SearchConfig

    loaded, hf = e["loaded"], e.get("hf")
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

    calls: dict[str, Callable[[], Any]] = {}
    if "hf" in e:
        int8 = e["ours_int8"].models[0]
        calls["ours"] = lambda: generate(loaded.model, src, bos_id=1, eos_id=eos, search=search)
        calls["ours_int8"] = lambda: generate(int8, src, bos_id=1, eos_id=eos, search=search)
        calls["transformers"] = hf_generate
    if "ct2_float32" in e:
        calls["ct2_float32"], calls["ct2_int8"] = ct2("ct2_float32"), ct2("ct2_int8")
    return calls


def _mean_length(output: Any, eos: int) -> float:
    """Mean generated tokens per sentence (``<eos>``, start token and padding excluded)."""
    if isinstance(output, torch.Tensor):
        rows = [[t for t in row if t not in (0, 1)] for row in output.tolist()]
        rows = [row[: row.index(eos)] if eos in row else row for row in rows]
    else:  # CTranslate2 results
        rows = [r.hypotheses[0] for r in output]
    return sum(map(len, rows)) / max(len(rows), 1)


@contextlib.contextmanager
def started_workers(args: argparse.Namespace, ckpt: Path, work: Path, **spec: Any) -> Any:
    """The worker processes for ``ckpt``, exported once here, closed on the way out."""
    hf_dir, ct2_dir = exports(ckpt, work)
    spec.update(ckpt=ckpt, hf_dir=hf_dir, ct2_dir=ct2_dir, threads=args.threads)
    workers = Workers(spec, one_process=args.one_process)
    try:
        yield workers
    finally:
        workers.close()


def bench_random(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    from transformer_mt.checkpoint import load_model
    from transformer_mt.data.tokenizer import SPECIAL_TOKENS

    ckpt = random_checkpoint(args, work / "random.ckpt")
    loaded = load_model(ckpt)
    g = torch.Generator().manual_seed(0)
    src = torch.randint(len(SPECIAL_TOKENS), args.vocab, (args.batch, args.src_len), generator=g)
    src[:, -1] = loaded.tokenizer.eos_id
    results: dict[str, Any] = {}
    spec = {"mode": "random", "src": src.tolist(), "new_tokens": args.new_tokens}
    with started_workers(args, ckpt, work, batch=args.batch, **spec) as workers:
        for beam in args.beams:
            workers.prepare(beam)  # each engine's first call: warm-up, and its output length
            results[f"beam{beam}_output_tokens"] = {
                name: workers.call("output", name) for name in ENGINES
            }
            times = timed_rounds(workers, args.repeats)
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
        "new_tokens": args.new_tokens,
        "processes": "one" if args.one_process else "one per engine family",
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
    calls: dict[str, Callable[[int], list[str]]] = {}
    if "hf" in e:
        int8 = Translator(loaded, search, max_sentences=batch, engine=e["ours_int8"])
        decode = loaded.tokenizer.decode_hypotheses
        calls["ours"] = lambda n: decode(ours.translate_ids(ids[:n]))
        calls["ours_int8"] = lambda n: decode(int8.translate_ids(ids[:n]))
        calls["transformers"] = hf_translator(e, ids, search, batch)
    for name in ("ct2_float32", "ct2_int8"):
        if name in e:  # through the same decode loop, batches of up to 64 tokens per sentence
            ct2 = Translator(loaded, search, batch * 64, engine=e[name])
            calls[name] = lambda n, ct2=ct2: ct2.translate(sources[:n])
    return calls


def bench_checkpoint(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    import sacrebleu

    from transformer_mt.checkpoint import load_model
    from transformer_mt.data.sources.files import iter_lines

    if args.data_dir is None:
        raise ValueError("--ckpt needs --data-dir (Multi30k with test_2016_flickr.*.gz)")
    loaded = load_model(Path(args.ckpt))
    src_lang, tgt_lang = loaded.src_lang or "en", loaded.tgt_lang or "de"
    sources = list(iter_lines(Path(args.data_dir) / f"test_2016_flickr.{src_lang}.gz"))
    refs = list(iter_lines(Path(args.data_dir) / f"test_2016_flickr.{tgt_lang}.gz"))
    if args.limit:
        sources, refs = sources[: args.limit], refs[: args.limit]
    results: dict[str, Any] = {}
    spec = {"mode": "checkpoint", "sources": sources, "batch": args.batch}
    with started_workers(args, Path(args.ckpt), work, **spec) as workers:
        for beam in args.beams:
            workers.prepare(beam)
            # Each round runs every engine over the whole set, the engines' order rotating,
            # so a machine that drifts over the minutes moves every engine alike.
            times = timed_rounds(workers, args.repeats)
            row: dict[str, Any] = {}
            for name, seconds in times.items():
                median = statistics.median(seconds)
                outputs = workers.call("output", name)  # identical every round
                row[name] = {
                    "median_s": median,
                    "seconds_per_round": seconds,
                    "x_generate_per_round": [g / t for g, t in zip(times["transformers"], seconds)],
                    "sentences_per_s": len(sources) / median,
                    "bleu": sacrebleu.corpus_bleu(outputs, [refs]).score,
                }
            results[f"beam{beam}"] = row
    return {
        "model": str(args.ckpt),
        "sentences": len(sources),
        "processes": "one" if args.one_process else "one per engine family",
        "results": results,
    }


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
