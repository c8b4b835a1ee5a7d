"""Service benchmark: ``transformer-mt-serve`` under concurrent clients vs the offline command.

On the same sentences (one per request, taken round-robin from ``--source``), three
measurements of one engine:

* offline: the sentences/s of ``transformer-mt-translate``'s engine translating them all in
  one process (built as that command builds it, model loading not timed; the median of
  ``--offline-repeats`` rounds);
* concurrent: ``--clients`` clients each sending one sentence per request, back to back, for
  ``--duration`` seconds in all against the server on 127.0.0.1 (its own process), split over
  the same rounds, alternating with the offline runs: sentences/s, latency p50/p95, errors;
* single: one client, one sentence at a time: latency p50/p95 (what one user waits).

Clients run in this process (asyncio + httpx), the server in another: on a small machine they
share the cores, which the JSON records with the load average.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from bench.common import Table, environment, goal

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


def offline_engine(args: argparse.Namespace) -> Any:
    """The engine ``transformer-mt-translate`` builds, with the benchmark's options."""
    from transformer_mt.cli.options import converter
    from transformer_mt.serve.model import ServedModel

    model = ServedModel.open(
        args.ckpt, engine=args.engine, ct2_model=args.ct2_model,
        compute_type=args.compute_type, threads=args.threads,
        convert=converter(args.engine, args.ct2_model),
    )  # fmt: skip
    search = model.search(beam_size=args.beam_size)
    return lambda lines: model.translate(lines, search)


def timed(fn: Any, *args: Any) -> float:
    start = time.perf_counter()
    fn(*args)
    return time.perf_counter() - start


def start_server(args: argparse.Namespace) -> tuple[subprocess.Popen[str], str]:
    script = Path(sys.executable).with_name("transformer-mt-serve")
    command = (
        [str(script)] if script.exists() else [sys.executable, "-m", "transformer_mt.cli.serve"]
    )
    command += ["--ckpt", str(args.ckpt), "--port", "0", "--threads", str(args.threads)]
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


async def load(url: str, lines: list[str], clients: int, duration: float, beam: int) -> dict:
    """``clients`` clients posting one sentence each, back to back, for ``duration`` seconds;
    the raw latencies, errors and elapsed time."""
    import httpx

    latencies: list[float] = []
    errors: list[str] = []
    counter = iter(range(10**9))
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as client:
        end = time.perf_counter() + duration

        async def one_client() -> None:
            while time.perf_counter() < end:
                line = lines[next(counter) % len(lines)]
                start = time.perf_counter()
                try:
                    r = await client.post("/translate", json={"text": [line], "beam_size": beam})
                    if r.status_code != 200 or len(r.json()["translations"]) != 1:
                        errors.append(f"{r.status_code}: {r.text[:200]}")
                        continue
                except httpx.HTTPError as err:
                    errors.append(repr(err))
                    continue
                latencies.append(time.perf_counter() - start)

        start = time.perf_counter()
        await asyncio.gather(*(one_client() for _ in range(clients)))
        elapsed = time.perf_counter() - start
    return {"latencies": latencies, "errors": errors, "seconds": elapsed}


def summary(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """Sentences/s, p50/p95 latency and errors of one or more :func:`load` runs."""
    latencies = sorted(x for part in parts for x in part["latencies"])
    errors = [e for part in parts for e in part["errors"]]
    elapsed = sum(part["seconds"] for part in parts)
    ordered = latencies or [float("nan")]

    def pct(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000

    return {
        "requests": len(latencies),
        "errors": len(errors),
        "first_errors": errors[:5],
        "seconds": elapsed,
        "sentences_per_s": len(latencies) / elapsed,
        "p50_ms": pct(0.50),
        "p95_ms": pct(0.95),
    }


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
    translate = offline_engine(args)
    translate(lines[:32])  # warm-up: allocator, lazy initialisation
    proc, url = start_server(args)
    rounds, beam = args.offline_repeats, args.beam_size
    offline_s: list[float] = []
    parts: list[dict[str, Any]] = []
    try:
        result["single"] = summary([asyncio.run(single(url, lines, args.single_requests, beam))])
        # Offline and concurrent runs alternate, so drift of a shared machine hits both alike.
        for _ in range(rounds):
            offline_s.append(timed(translate, lines))
            parts.append(asyncio.run(load(url, lines, args.clients, args.duration / rounds, beam)))
    finally:
        proc.terminate()
        proc.wait(30)
    result["offline"] = {
        "seconds": offline_s,
        "sentences_per_s": len(lines) / statistics.median(offline_s),
    }
    result["concurrent"] = summary(parts)
    result["load_average_after"] = list(os.getloadavg())
    ratio = result["concurrent"]["sentences_per_s"] / result["offline"]["sentences_per_s"]
    result["server_over_offline"] = ratio
    result["goals"] = [
        goal("server sentences/s over offline (16 clients)", ratio, 0.8),
        goal("concurrent errors", result["concurrent"]["errors"], 0, higher_is_better=False),
        goal("single-sentence p50 latency ms", result["single"]["p50_ms"], 50.0, False),
    ]
    return result


async def single(url: str, lines: list[str], requests: int, beam: int) -> dict[str, Any]:
    """One client, one sentence per request, ``requests`` times in a row."""
    import httpx

    latencies: list[float] = []
    errors: list[str] = []
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        start_all = time.perf_counter()
        for i in range(requests):
            body = {"text": [lines[i % len(lines)]], "beam_size": beam}
            start = time.perf_counter()
            r = await client.post("/translate", json=body)
            if r.status_code != 200:
                errors.append(f"{r.status_code}: {r.text[:200]}")
                continue
            latencies.append(time.perf_counter() - start)
        elapsed = time.perf_counter() - start_all
    return {"latencies": latencies, "errors": errors, "seconds": elapsed}


def tables(result: dict[str, Any]) -> list[Table]:
    s, env = result["settings"], result["environment"]
    title = (
        f"serve: {s['engine']}{' ' + s['compute_type'] if s['compute_type'] else ''}, beam "
        f"{s['beam_size']}, {result['sentences']} sentences, {s['threads']} threads, "
        f"{env['cpu']}, load {env['load_average'][0]:.1f}"
    )
    c, one, off = result["concurrent"], result["single"], result["offline"]
    rows = [
        [
            "transformer-mt-translate (one process)",
            f"{off['sentences_per_s']:.1f}",
            *("-" * 3),
            "1.00x",
        ],
        [
            f"server, {s['clients']} clients, {s['duration']:g} s",
            f"{c['sentences_per_s']:.1f}", f"{c['p50_ms']:.0f}", f"{c['p95_ms']:.0f}",
            str(c["errors"]), f"{result['server_over_offline']:.2f}x",
        ],
        [
            "server, 1 client",
            f"{one['sentences_per_s']:.1f}", f"{one['p50_ms']:.0f}", f"{one['p95_ms']:.0f}",
            str(one["errors"]), f"{one['sentences_per_s'] / off['sentences_per_s']:.2f}x",
        ],
    ]  # fmt: skip
    header = ["", "sentences/s", "p50 ms", "p95 ms", "errors", "vs offline"]
    return [(title, header, rows)]
