"""Service benchmark: ``transformer-mt-serve`` under concurrent clients vs the offline command.

On the same sentences (one per request, taken round-robin from ``--source``), the
measurements of one engine:

* offline: the sentences/s of ``transformer-mt-translate``'s engine translating them all in
  one process (built as that command builds it, model loading not timed; the median of
  ``--offline-repeats`` rounds), and the same engine fed batches of ``--clients`` sentences:
  the most that many one-sentence clients could get if the service cost nothing;
* concurrent: ``--clients`` clients each sending one sentence per request, back to back, for
  ``--duration`` seconds in all, split over the same rounds, alternating with the offline runs:
  sentences/s, latency p50/p95, errors;
* single: one client, one sentence at a time: latency p50/p95 (what one user waits) and where
  the server's share of it goes, from each answer's ``Server-Timing`` header (medians per stage,
  :mod:`transformer_mt.serve.timing`), with the engine call taken apart in this process
  (tokenisation, search, detokenisation).

The server runs in its own process, and so do the clients (:mod:`serve_clients`, plain
HTTP/1.1 over asyncio): the three share the machine's cores, as they would on a user's, and
the JSON records the load average.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench.common import Table, environment, goal
from transformer_mt.serve.timing import STAGES

NAME = "serve"
HELP = "transformer-mt-serve under concurrent clients vs transformer-mt-translate offline"
QUICK = {
    "clients": 4, "duration": 2.0, "single_requests": 5, "sentences": 16, "offline_repeats": 2,
}  # fmt: skip

DEFAULT_SOURCE = Path("../shared/data/multi30k/test_2016_flickr.de.gz")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Options of ``benchmark.py serve``."""
    p.add_argument("--ckpt", type=Path, help="checkpoint to serve (required)")
    p.add_argument(
        "--source", type=Path, default=DEFAULT_SOURCE, help="sentences, one a line (.gz or text)"
    )
    p.add_argument("--sentences", type=int, default=0, help="use the first N (0 = all)")
    p.add_argument("--engine", choices=("torch", "ctranslate2"), default="torch")
    p.add_argument("--compute-type", help="CTranslate2 weights: int8, float32, ...")
    p.add_argument("--ct2-model", type=Path, help="CTranslate2 dir (else converted at start)")
    p.add_argument("--beam-size", type=int, default=1, help="1 = greedy")
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--duration", type=float, default=60.0, help="seconds of concurrent load")
    p.add_argument("--single-requests", type=int, default=200, help="one-client requests")
    p.add_argument("--offline-repeats", type=int, default=3)
    p.add_argument("--window-ms", type=float, default=5.0, help="the server's batching window")
    p.add_argument(
        "--server-threads", type=int, default=0,
        help="the server's --threads (0: the service's default; --threads is the offline side's)",
    )  # fmt: skip


def read_sentences(path: Path, limit: int) -> list[str]:
    opener: Any = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        lines = [line.rstrip("\n") for line in f if line.strip()]
    return lines[:limit] if limit > 0 else lines


def engine_flags(args: argparse.Namespace) -> list[str]:
    flags = ["--engine", args.engine, "--beam-size", str(args.beam_size)]
    if args.compute_type:
        flags += ["--compute-type", args.compute_type]
    if args.ct2_model:
        flags += ["--ct2-model", str(args.ct2_model)]
    return flags


def offline_engine(args: argparse.Namespace) -> tuple[Any, Any]:
    """The model and the engine call ``transformer-mt-translate`` builds, with the
    benchmark's options."""
    from transformer_mt.cli.options import converter
    from transformer_mt.inference.search import SearchConfig
    from transformer_mt.serve.model import ServedModel

    model = ServedModel.open(
        args.ckpt, engine=args.engine, ct2_model=args.ct2_model,
        compute_type=args.compute_type, threads=args.threads,
        convert=converter(args.engine, args.ct2_model),
    )  # fmt: skip
    search = SearchConfig.from_stored(model.loaded.decoding, beam_size=args.beam_size)
    return model, lambda lines: model.translate(lines, search)


def timed(fn: Any, *args: Any) -> float:
    start = time.perf_counter()
    fn(*args)
    return time.perf_counter() - start


def start_server(args: argparse.Namespace) -> tuple[subprocess.Popen[str], str]:
    script = Path(sys.executable).with_name("transformer-mt-serve")
    command = (
        [str(script)] if script.exists() else [sys.executable, "-m", "transformer_mt.cli.serve"]
    )
    command += ["--ckpt", str(args.ckpt), "--port", "0", "--threads", str(args.server_threads)]
    command += ["--window-ms", str(args.window_ms), *engine_flags(args)]
    command = _without_beam(command)
    proc = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    for line in proc.stderr:
        if line.startswith("serving on "):
            threading.Thread(target=proc.stderr.read, daemon=True).start()
            return proc, line.split()[-1]
    raise RuntimeError(f"transformer-mt-serve exited with {proc.wait()} before serving")


def _without_beam(command: list[str]) -> list[str]:
    """The server takes the beam size per request, not as a flag."""
    i = command.index("--beam-size")
    return command[:i] + command[i + 2 :]


def summary(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """Sentences/s, p50/p95 latency and errors of one or more :func:`load` runs."""
    latencies = sorted(x for part in parts for x in part["latencies"])
    errors = [e for part in parts for e in part["errors"]]
    elapsed = sum(part["seconds"] for part in parts)
    ordered = latencies or [float("nan")]

    def pct(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000

    stages = [stage for part in parts for stage in part.get("stages", ())]
    medians = {
        name: statistics.median(s[name] for s in stages if name in s)
        for name in ("total", *STAGES, "answer")
        if any(name in s for s in stages)
    }
    return {
        **({"server_stages_ms": medians} if medians else {}),
        "requests": len(latencies),
        "errors": len(errors),
        "first_errors": errors[:5],
        "seconds": elapsed,
        "sentences_per_s": len(latencies) / elapsed,
        "p50_ms": pct(0.50),
        "p95_ms": pct(0.95),
    }


def clients(url: str, lines_file: Path, *args: Any) -> dict[str, Any]:
    """Run :mod:`serve_clients` in its own process (``args``: its mode and numbers) and read
    what it measured."""
    script = Path(__file__).with_name("serve_clients.py")
    command = [sys.executable, str(script), url, str(lines_file), *map(str, args)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"the clients failed ({done.returncode}): {done.stderr[-2000:]}")
    return json.loads(done.stdout)


def engine_stages(args: argparse.Namespace, model: Any, lines: list[str]) -> dict[str, float]:
    """Median milliseconds of the engine call's parts for one sentence at a time, in this
    process, on the threads the service gives such a call: tokenisation, the search,
    detokenisation (the ``engine`` stage, taken apart)."""
    from transformer_mt.inference.search import SearchConfig

    translator = model.translator_for(None)
    search = SearchConfig.from_stored(model.loaded.decoding, beam_size=args.beam_size)
    parts: dict[str, list[float]] = {"tokenise": [], "search": [], "detokenise": []}
    model.pin_threads(max(search.beam_size, search.nbest))  # one sentence's rows
    for line in lines:
        t0 = time.perf_counter()
        ids = translator.encode([line])
        t1 = time.perf_counter()
        hyps = translator.decode_ids(ids, search)
        t2 = time.perf_counter()
        translator.tokenizer.decode_hypotheses([h.tokens for h in hyps[0]])
        t3 = time.perf_counter()
        for name, seconds in zip(parts, (t1 - t0, t2 - t1, t3 - t2)):
            parts[name].append(seconds * 1000)
    return {name: statistics.median(values) for name, values in parts.items()}


def run(args: argparse.Namespace) -> dict[str, Any]:
    if args.ckpt is None:
        raise ValueError("benchmark.py serve needs --ckpt CHECKPOINT (a .ckpt written by train.py)")
    if not args.source.is_file():
        raise FileNotFoundError(f"--source {args.source} does not exist; pass a file of sentences")
    lines = read_sentences(args.source, args.sentences)
    result: dict[str, Any] = {
        "benchmark": NAME,
        "settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "sentences": len(lines),
        "environment": environment(),
    }
    model, translate = offline_engine(args)
    translate(lines[:32])  # warm-up: allocator, lazy initialisation

    def in_batches(size: int) -> None:
        for i in range(0, len(lines), size):
            translate(lines[i : i + size])

    proc, url = start_server(args)
    rounds, beam = args.offline_repeats, args.beam_size
    offline_s: list[float] = []
    batched_s: list[float] = []
    parts: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        lines_file = Path(tmp) / "lines.json"
        lines_file.write_text(json.dumps(lines), encoding="utf-8")
        try:
            # The lone client and the same engine call in this process alternate in chunks
            # of the same sentences, so that the service's share of a lone request is read
            # from neighbouring minutes of a machine that may drift.
            singles, stages = [], []
            n = args.single_requests
            for chunk in [n // rounds + (i < n % rounds) for i in range(rounds)]:
                if chunk:
                    singles.append(clients(url, lines_file, "single", chunk, beam))
                    stages.append(engine_stages(args, model, lines[:chunk]))
            result["single"] = summary(singles)
            result["engine_stages_ms"] = {
                name: statistics.median(s[name] for s in stages) for name in stages[0]
            }
            # Offline and concurrent runs alternate, so drift of a shared machine hits both
            # alike; the clients run in their own process, as a user's would.
            for _ in range(rounds):
                offline_s.append(timed(translate, lines))
                batched_s.append(timed(in_batches, args.clients))
                load = clients(url, lines_file, "load", args.clients, args.duration / rounds, beam)
                parts.append(load)
        finally:
            proc.terminate()
            proc.wait(30)
    result["offline"] = {
        "seconds": offline_s,
        "sentences_per_s": len(lines) / statistics.median(offline_s),
    }
    result["offline_in_client_batches"] = {
        "batch": args.clients,
        "seconds": batched_s,
        "sentences_per_s": len(lines) / statistics.median(batched_s),
    }
    result["concurrent"] = summary(parts)
    result["load_average_after"] = list(os.getloadavg())
    ratio = result["concurrent"]["sentences_per_s"] / result["offline"]["sentences_per_s"]
    result["server_over_offline"] = ratio
    lone_goal = 15.0 if args.engine == "torch" else 10.0
    result["goals"] = [
        goal(f"server sentences/s over offline ({args.clients} clients)", ratio, 0.8),
        goal("concurrent errors", result["concurrent"]["errors"], 0, higher_is_better=False),
        goal("single-sentence p50 latency ms", result["single"]["p50_ms"], lone_goal, False),
    ]
    return result


def tables(result: dict[str, Any]) -> list[Table]:
    s, env = result["settings"], result["environment"]
    title = (
        f"serve: {s['engine']}{' ' + s['compute_type'] if s['compute_type'] else ''}, beam "
        f"{s['beam_size']}, {result['sentences']} sentences, {s['threads']} threads, "
        f"{env['cpu']}, load {env['load_average'][0]:.1f}"
    )
    c, one, off = result["concurrent"], result["single"], result["offline"]
    batched = result["offline_in_client_batches"]
    rate = off["sentences_per_s"]
    rows = [
        ["transformer-mt-translate (one process)", f"{rate:.1f}", *("-" * 3), "1.00x"],
        [
            f"the same engine, batches of {batched['batch']}",
            f"{batched['sentences_per_s']:.1f}", *("-" * 3),
            f"{batched['sentences_per_s'] / rate:.2f}x",
        ],
        [
            f"server, {s['clients']} clients, {s['duration']:g} s",
            f"{c['sentences_per_s']:.1f}", f"{c['p50_ms']:.0f}", f"{c['p95_ms']:.0f}",
            str(c["errors"]), f"{result['server_over_offline']:.2f}x",
        ],
        [
            "server, 1 client",
            f"{one['sentences_per_s']:.1f}", f"{one['p50_ms']:.1f}", f"{one['p95_ms']:.1f}",
            str(one["errors"]), f"{one['sentences_per_s'] / rate:.2f}x",
        ],
    ]  # fmt: skip
    header = ["", "sentences/s", "p50 ms", "p95 ms", "errors", "vs offline"]
    out: list[Table] = [(title, header, rows)]
    stages = one.get("server_stages_ms", {})
    if stages:
        breakdown = [["client: the whole request", f"{one['p50_ms']:.2f}"]]
        breakdown += [[f"server: {name}", f"{ms:.2f}"] for name, ms in stages.items()]
        breakdown += [
            [f"  engine, alone: {name}", f"{ms:.2f}"]
            for name, ms in result["engine_stages_ms"].items()
        ]
        out.append(("one lone request, medians", ["stage", "ms"], breakdown))
    return out
