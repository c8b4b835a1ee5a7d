"""Memory and time of data preparation on a large file corpus, then of the first batches.

    python scripts/make_large_corpus.py /tmp/big --pairs 1000000
    python scripts/benchmark.py data-memory /tmp/big --cache-dir /tmp/big_cache --work-dir /tmp/run
    python scripts/benchmark.py data-memory /tmp/big --cache-dir /tmp/big_cache --work-dir /tmp/run

The first call tokenizes and writes the Arrow cache (and ``tokenizer.json`` into
``--work-dir``); the second finds both and only memory-maps. Each phase records its wall time,
the resident memory after it and the peak so far (``ru_maxrss``), plus the size of the corpus
files and of the cache. Run it in a process of its own: the figures are the process's.

Resident memory has two parts (``/proc/self/status``): ``RssAnon``, the process's own
heap (Python objects, Rust/Arrow buffers) -- what must stay bounded -- and ``RssFile``,
pages of memory-mapped files such as the Arrow cache, which are page cache the kernel
can drop at any time. A sampling thread records the peak of ``RssAnon`` per phase.
"""

from __future__ import annotations

import argparse
import logging
import threading
import time
from pathlib import Path
from typing import Any

from bench.common import Table, environment
from transformer_mt.provenance import peak_resident_bytes

NAME = "data-memory"
HELP = "time and memory of preparing a large file corpus and loading its first batches"
QUICK = {"batches": 5, "vocab_size": 300}

log = logging.getLogger("bench.data_memory")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Options of ``benchmark.py data-memory``."""
    p.add_argument("dir", type=Path, help="corpus directory ({prefix}.{lang} files)")
    p.add_argument("--cache-dir", type=Path, default=None, help="Arrow cache (None: RAM)")
    p.add_argument("--work-dir", type=Path, default=None, help="where tokenizer.json goes")
    p.add_argument("--src-lang", default="en")
    p.add_argument("--tgt-lang", default="de")
    p.add_argument("--vocab-size", type=int, default=8000)
    p.add_argument("--max-tokens", type=int, default=8192)
    p.add_argument("--max-len", type=int, default=256)
    p.add_argument("--num-proc", type=int, default=1)
    p.add_argument("--batches", type=int, default=100, help="training batches to load")


def rss_mb(field: str = "VmRSS") -> float:
    """A memory field of ``/proc/self/status`` (``VmRSS``, ``RssAnon``, ``RssFile``) in MB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024 / 1e6
    raise KeyError(field)


class AnonPeak:
    """Samples ``RssAnon`` in a thread; :meth:`take` returns the peak since the last take."""

    def __init__(self, interval: float = 0.05) -> None:
        self.interval, self.peak = interval, 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.peak = max(self.peak, rss_mb("RssAnon"))

    def take(self) -> float:
        peak, self.peak = max(self.peak, rss_mb("RssAnon")), 0.0
        return peak

    def stop(self) -> None:
        self._stop.set()


def peak_rss_mb() -> float:
    """Peak resident set size of this process so far, in MB."""
    return (peak_resident_bytes() or 0) / 1e6


def dir_mb(path: Path, pattern: str = "*") -> float:
    """Total size of the files matching ``pattern`` below ``path``, in MB."""
    return sum(p.stat().st_size for p in path.rglob(pattern) if p.is_file()) / 1e6


def phase_record(started: float, sampler: AnonPeak) -> dict[str, float]:
    """Wall time since ``started`` and the memory figures at the end of a phase."""
    return {
        "seconds": round(time.perf_counter() - started, 1),
        "rss_mb": round(rss_mb(), 1),
        "anon_mb": round(rss_mb("RssAnon"), 1),
        "file_mb": round(rss_mb("RssFile"), 1),
        "peak_anon_mb": round(sampler.take(), 1),
        "peak_rss_mb": round(peak_rss_mb(), 1),
    }


def datamodule_for(args: argparse.Namespace) -> Any:
    """The project's data module over the corpus, with the command line's limits."""
    from transformer_mt.data.config import DataConfig
    from transformer_mt.data.datamodule import TranslationDataModule

    if not args.dir.is_dir():
        raise FileNotFoundError(
            f"Corpus directory not found: {args.dir}; write one with "
            "scripts/make_large_corpus.py DIR"
        )
    config = DataConfig(
        source="files",
        src_lang=args.src_lang,
        tgt_lang=args.tgt_lang,
        dir=str(args.dir),
        prefixes={"train": "train", "validation": "val", "test": "test"},
        file_format="parallel",
        vocab_size=args.vocab_size,
        max_tokens=args.max_tokens,
        eval_max_tokens=args.max_tokens,
        max_len=args.max_len,
        num_proc=args.num_proc,
        cache_dir=None if args.cache_dir is None else str(args.cache_dir),
    )
    return TranslationDataModule(config, work_dir=args.work_dir)


def first_batches(datamodule: Any, n: int) -> tuple[int, int]:
    """Batches per epoch, and the source tokens of the first ``n`` training batches."""
    loader = datamodule.train_dataloader()
    tokens = 0
    for i, batch in enumerate(loader):
        tokens += int((batch["src"] != datamodule.pad_id).sum())
        if i + 1 >= n:
            break
    return len(loader), tokens


def run(args: argparse.Namespace) -> dict[str, Any]:
    results: dict[str, Any] = {
        "corpus_mb": round(dir_mb(args.dir), 1) if args.dir.is_dir() else 0.0,
        "cache_existed": bool(args.cache_dir and any(args.cache_dir.glob("*.arrow"))),
        "start_rss_mb": round(rss_mb(), 1),
        "start_anon_mb": round(rss_mb("RssAnon"), 1),
    }
    sampler = AnonPeak()
    try:
        started = time.perf_counter()
        datamodule = datamodule_for(args)
        datamodule.prepare_data()
        datamodule.setup("fit")
        results["prepare"] = phase_record(started, sampler)
        log.info("prepare: %s", results["prepare"])
        results["train_pairs"] = len(datamodule.splits["train"])
        started = time.perf_counter()
        per_epoch, tokens = first_batches(datamodule, args.batches)
        results["train_batches_per_epoch"] = per_epoch
        results[f"first_{args.batches}_batches"] = phase_record(started, sampler)
        results["source_tokens_loaded"] = tokens
    finally:
        sampler.stop()
    if args.cache_dir is not None:
        results["cache_mb"] = round(dir_mb(args.cache_dir, "*.arrow"), 1)
    results["environment"] = environment()
    return results


def tables(result: dict[str, Any]) -> list[Table]:
    header = ["phase", "seconds", "RSS MB", "anon MB", "file MB", "peak anon MB", "peak RSS MB"]
    keys = ["seconds", "rss_mb", "anon_mb", "file_mb", "peak_anon_mb", "peak_rss_mb"]
    phases = [k for k, v in result.items() if isinstance(v, dict) and "seconds" in v]
    rows = [[name] + [f"{result[name][k]:,.1f}" for k in keys] for name in phases]
    title = (
        f"Data preparation: {result['train_pairs']:,} training pairs, corpus "
        f"{result['corpus_mb']:,.1f} MB, cache {'reused' if result['cache_existed'] else 'built'}"
    )
    return [(title, header, rows)]
