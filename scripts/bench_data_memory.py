"""Memory and time of data preparation on a large file corpus, then of the first batches.

    python scripts/make_large_corpus.py /tmp/big --pairs 1000000
    python scripts/bench_data_memory.py /tmp/big --cache-dir /tmp/big_cache --work-dir /tmp/big_run
    python scripts/bench_data_memory.py /tmp/big --cache-dir /tmp/big_cache --work-dir /tmp/big_run

The first call tokenizes and writes the Arrow cache (and ``tokenizer.json`` into
``--work-dir``); the second finds both and only memory-maps. Each phase prints its
wall time, the resident memory after it and the peak so far (``ru_maxrss``), plus the
size of the corpus files and of the cache, as one JSON line at the end (``--json``).

Resident memory has two parts (``/proc/self/status``): ``RssAnon``, the process's own
heap (Python objects, Rust/Arrow buffers) -- what must stay bounded -- and ``RssFile``,
pages of memory-mapped files such as the Arrow cache, which are page cache the kernel
can drop at any time. A sampling thread records the peak of ``RssAnon`` per phase.
"""

from __future__ import annotations

import argparse
import json
import logging
import resource
import threading
import time
from pathlib import Path
from typing import Any

from transformer_mt.data.config import DataConfig
from transformer_mt.data.datamodule import TranslationDataModule

log = logging.getLogger("bench_data_memory")


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
        while not self._stop.is_set():
            self.peak = max(self.peak, rss_mb("RssAnon"))
            time.sleep(self.interval)

    def take(self) -> float:
        peak, self.peak = max(self.peak, rss_mb("RssAnon")), 0.0
        return peak

    def stop(self) -> None:
        self._stop.set()


def peak_rss_mb() -> float:
    """Peak resident set size of this process so far, in MB (``ru_maxrss`` is KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e6


def dir_mb(path: Path, pattern: str = "*") -> float:
    """Total size of the files matching ``pattern`` below ``path``, in MB."""
    return sum(p.stat().st_size for p in path.rglob(pattern) if p.is_file()) / 1e6


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dir", type=Path, help="corpus directory ({prefix}.{lang} files)")
    parser.add_argument("--cache-dir", type=Path, default=None, help="Arrow cache (None: RAM)")
    parser.add_argument("--work-dir", type=Path, default=None, help="where tokenizer.json goes")
    parser.add_argument("--src-lang", default="en")
    parser.add_argument("--tgt-lang", default="de")
    parser.add_argument("--vocab-size", type=int, default=8000)
    parser.add_argument("--max-tokens", type=int, default=8192)
    parser.add_argument("--max-len", type=int, default=256)
    parser.add_argument("--num-proc", type=int, default=1)
    parser.add_argument("--batches", type=int, default=100, help="training batches to load")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")

    results: dict[str, Any] = {
        "corpus_mb": round(dir_mb(args.dir), 1),
        "cache_existed": bool(args.cache_dir and any(args.cache_dir.glob("*.arrow"))),
        "start_rss_mb": round(rss_mb(), 1),
        "start_anon_mb": round(rss_mb("RssAnon"), 1),
    }
    sampler = AnonPeak()

    def phase(name: str, started: float) -> None:
        results[name] = {
            "seconds": round(time.perf_counter() - started, 1),
            "rss_mb": round(rss_mb(), 1),
            "anon_mb": round(rss_mb("RssAnon"), 1),
            "file_mb": round(rss_mb("RssFile"), 1),
            "peak_anon_mb": round(sampler.take(), 1),
            "peak_rss_mb": round(peak_rss_mb(), 1),
        }
        log.info("%s: %s", name, results[name])

    started = time.perf_counter()
    datamodule = TranslationDataModule(
        DataConfig(
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
        ),
        work_dir=args.work_dir,
    )
    datamodule.prepare_data()
    datamodule.setup("fit")
    phase("prepare", started)
    results["train_pairs"] = len(datamodule.splits["train"])

    started = time.perf_counter()
    loader = datamodule.train_dataloader()
    results["train_batches_per_epoch"] = len(loader)
    tokens = 0
    for i, batch in enumerate(loader):
        tokens += int((batch["src"] != datamodule.pad_id).sum())
        if i + 1 >= args.batches:
            break
    phase(f"first_{args.batches}_batches", started)
    results["source_tokens_loaded"] = tokens
    sampler.stop()
    if args.cache_dir is not None:
        results["cache_mb"] = round(dir_mb(args.cache_dir, "*.arrow"), 1)
    print(json.dumps(results))
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return results


if __name__ == "__main__":
    main()
