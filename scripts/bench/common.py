"""What every benchmark of ``scripts/benchmark.py`` shares: timing, memory, FLOP peak, profiling,
synthetic models and batches, the common command-line options, output.

Timing is wall-clock (``time.perf_counter``) on the CPU. Contenders are *interleaved*: every
repeat runs each contender once, in a rotating order, so slow drift of a shared machine (other
jobs, thermal state) hits all of them alike; the reported figure is the median over repeats.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from transformer_mt.cli import allocator
from transformer_mt.model.embedding import TokenEmbedding, TransformerEmbedding
from transformer_mt.model.transformer import ModelConfig
from transformer_mt.provenance import machine, matmul_seconds

#: JSON/markdown tables: a header and rows of already formatted cells.
Table = tuple[str, list[str], list[list[str]]]

#: Special ids of the synthetic vocabularies.
PAD, BOS, EOS = 0, 1, 2


def setup_torch(threads: int, seed: int = 0) -> None:
    """Pin the intra-op thread count (the machine is shared) and seed the generators."""
    torch.set_num_threads(threads)
    torch.manual_seed(seed)


def environment() -> dict[str, Any]:
    """What the numbers were measured on: versions, CPU, thread settings, load, UTC time.

    The OpenMP variables are recorded because they change CPU timings (OpenMP reads them once,
    when torch loads), and so are what malloc does with freed memory (cli/allocator.py) and how
    many compiled bf16 kernels oneDNN keeps (cli/entry.py);
    ``cuda`` names the GPU, if any.
    """
    return {
        **machine(),  # CPU model, family, units, cores, threads, load, versions: as runs record
        "inter_op_threads": torch.get_num_interop_threads(),
        "malloc": _malloc(),
        "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY"),
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
        "ONEDNN_PRIMITIVE_CACHE_CAPACITY": os.environ.get("ONEDNN_PRIMITIVE_CACHE_CAPACITY"),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "time": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
    }


def environment_line(env: dict[str, Any]) -> str:
    """One line that goes beside every printed figure: CPU model, threads, machine load."""
    load = env.get("load_average")
    parts = [
        f"CPU: {env['cpu']}"
        + (f", family {env['cpu_family']}" if env.get("cpu_family") is not None else "")
        + (f" model {env['cpu_model_number']}" if env.get("cpu_model_number") is not None else "")
        + (f" ({env['cpu_capability']})" if env.get("cpu_capability") else "")
        + (f", units {' '.join(env['cpu_units'])}" if env.get("cpu_units") else ""),
        f"GPU: {env['cuda']}" if env.get("cuda") else None,
        f"{env['threads']} intra-op threads" if env.get("threads") else None,
        f"OMP_WAIT_POLICY={env['OMP_WAIT_POLICY']}" if env.get("OMP_WAIT_POLICY") else None,
        "load average " + " ".join(f"{x:.2f}" for x in load) if load else None,
        f"{env['time']} UTC" if env.get("time") else None,
    ]
    return "; ".join(p for p in parts if p)


def interleaved_times(
    contenders: dict[str, Callable[[], Any]],
    repeats: int,
    warmup: int = 1,
    repeats_per: dict[str, int] | None = None,
    self_timed: bool = False,
) -> dict[str, list[float]]:
    """Time each callable ``repeats`` times, interleaving contenders; seconds per call.

    Args:
        contenders: name -> zero-argument callable doing one unit of work.
        repeats: timed calls per contender.
        warmup: untimed calls per contender first (allocator, lazy init, kernel choice).
        repeats_per: optional lower repeat count for expensive contenders; they take part
            in the first ``repeats_per[name]`` rounds only.
        self_timed: each call answers its own seconds instead (its work timed where it runs,
            e.g. in another process).
    """
    repeats_per = repeats_per or {}
    names = list(contenders)
    for _ in range(warmup):
        for name in names:
            if repeats_per.get(name, repeats) > 0:
                contenders[name]()
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(repeats):
        order = names[r % len(names) :] + names[: r % len(names)]  # rotate the start
        for name in order:
            if r >= repeats_per.get(name, repeats):
                continue
            start = time.perf_counter()
            answer = contenders[name]()
            times[name].append(answer if self_timed else time.perf_counter() - start)
    return times


def median(values: list[float]) -> float:
    """Median of a non-empty list (``nan`` when empty, e.g. a skipped contender)."""
    return statistics.median(values) if values else float("nan")


def matmul_peak_flops(n: int = 2048, repeats: int = 5) -> dict[str, float]:
    """Measured fp32 FLOP/s of one ``n x n @ n x n`` ``torch.matmul`` (median, best)."""
    times = matmul_seconds(n, repeats, warmup=2)
    flops = 2.0 * n**3
    return {
        "n": n,
        "median_flops_per_s": flops / median(times),
        "best_flops_per_s": flops / min(times),
    }


class SavedTensorBytes:
    """Sum the bytes of tensors autograd saves for backward (a context manager).

    This is the activation memory a training step keeps alive between forward and backward:
    deterministic (unlike allocator statistics on a shared CPU) and exactly the quantity that
    grows linearly or quadratically with sequence length. Each storage is counted once (views
    share storage), and storages of the ``exclude`` tensors (parameters) are not counted.
    """

    def __init__(self, exclude: list[torch.Tensor] | None = None) -> None:
        self._exclude = {t.untyped_storage().data_ptr() for t in exclude or []}
        self._seen: dict[int, int] = {}
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda x: x)

    def _pack(self, tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        ptr = storage.data_ptr()
        if ptr not in self._exclude and ptr != 0:
            self._seen[ptr] = storage.nbytes()
        return tensor

    @property
    def bytes(self) -> int:
        return sum(self._seen.values())

    def __enter__(self) -> SavedTensorBytes:
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._hooks.__exit__(*exc)


#: Ops that are matrix multiplications (what a FLOP peak measured with matmul can reach).
MATMUL_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul")


def top_ops(fn: Callable[[], Any], rows: int = 12, calls: int = 2) -> dict[str, Any]:
    """Profile ``calls`` calls of ``fn`` with ``torch.profiler``; top ops by self CPU time.

    Times are per call. ``matmul_pct`` is the share of self CPU time spent in
    :data:`MATMUL_OPS` (SDPA kernels not included): what is left is elementwise work,
    reductions, copies and framework overhead.
    """
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(calls):
            fn()
    events = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    total = sum(e.self_cpu_time_total for e in events) or 1.0
    matmul = sum(e.self_cpu_time_total for e in events if e.key in MATMUL_OPS)
    return {
        "calls": calls,
        "self_cpu_ms_per_call": round(total / 1e3 / calls, 1),
        "matmul_pct": round(100.0 * matmul / total, 1),
        "top": [
            {
                "op": e.key,
                "self_cpu_ms": round(e.self_cpu_time_total / 1e3 / calls, 2),
                "self_cpu_pct": round(100.0 * e.self_cpu_time_total / total, 1),
                "calls": e.count // calls,
            }
            for e in events[:rows]
        ],
    }


def profile_tables(profiles: dict[str, dict[str, Any]], what: str) -> list[Table]:
    """One table per profiled contender (see :func:`top_ops`)."""
    tables: list[Table] = []
    for name, prof in profiles.items():
        title = (
            f"Top ops by self CPU time per {what}, {name} "
            f"(total {prof['self_cpu_ms_per_call']} ms, matmul {prof['matmul_pct']}%)"
        )
        rows = [
            [o["op"], f"{o['self_cpu_ms']:.1f}", f"{o['self_cpu_pct']:.1f}", str(o["calls"])]
            for o in prof["top"]
        ]
        tables.append((title, ["op", "self ms", "%", "calls"], rows))
    return tables


def parameter_count(module: nn.Module) -> int:
    """Parameters, each shared tensor counted once."""
    return sum(p.numel() for p in module.parameters())


def goal(name: str, value: float, target: float, higher_is_better: bool = True) -> dict[str, Any]:
    """A goal record: met when ``value`` is on the right side of ``target``."""
    met = value >= target if higher_is_better else value <= target
    return {
        "goal": name,
        "value": round(value, 3),
        "target": target,
        "comparison": ">=" if higher_is_better else "<=",
        "met": bool(met),
    }


# ----------------------------------------------------------------------------- synthetic data


def synthetic_batch(
    batch: int, max_len: int, min_len: int, vocab: int, generator: torch.Generator
) -> tuple[Tensor, Tensor, Tensor]:
    """Random ``(src, tgt_in, tgt_out)`` with lengths uniform in ``[min_len, max_len]``.

    ``tgt_in`` is bos + tokens, ``tgt_out`` is tokens + eos; both are padded to ``max_len``.
    """

    def sentences(length: int) -> tuple[Tensor, Tensor]:
        lengths = torch.randint(min(min_len, length), length + 1, (batch,), generator=generator)
        ids = torch.randint(3, vocab, (batch, length), generator=generator)
        keep = torch.arange(length)[None, :] < lengths[:, None]
        return ids.masked_fill(~keep, PAD), lengths

    src, _ = sentences(max_len)
    body, lengths = sentences(max_len - 1)  # tokens without bos/eos
    tgt_in = torch.cat([torch.full((batch, 1), BOS), body], dim=1)  # (B, max_len)
    tgt_out = torch.cat([body, torch.full((batch, 1), PAD)], dim=1)  # (B, max_len)
    tgt_out[torch.arange(batch), lengths] = EOS
    return src, tgt_in, tgt_out


def model_config(args: argparse.Namespace, **extra: Any) -> ModelConfig:
    """The benchmarked model: sizes from the command line, shared vocabulary, tied weights."""
    return ModelConfig(
        src_vocab_size=args.vocab,
        tgt_vocab_size=args.vocab,
        pad_id=PAD,
        d_model=args.d_model,
        n_heads=args.n_heads,
        d_ff=args.d_ff,
        n_encoder_layers=args.layers,
        n_decoder_layers=args.layers,
        **extra,
    )


class TorchTransformerMT(nn.Module):
    """``torch.nn.Transformer`` with our embeddings, positional encodings and tied generator.

    Everything outside the encoder/decoder stacks is the same module type as in our
    ``Transformer``, so a timing difference comes from the stacks alone. ``nn.Transformer``
    always appends a final LayerNorm to both stacks; for post-LN (our default) those are
    removed to match our model.
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        c = config
        token = TokenEmbedding(c.src_vocab_size, c.d_model, c.pad_id)
        self.src_embedding = TransformerEmbedding(token, c)
        self.tgt_embedding = TransformerEmbedding(token, c)
        self.transformer = nn.Transformer(
            d_model=c.d_model,
            nhead=c.n_heads,
            num_encoder_layers=c.n_encoder_layers,
            num_decoder_layers=c.n_decoder_layers,
            dim_feedforward=c.d_ff,
            dropout=c.dropout,
            activation=c.activation,
            batch_first=True,
            norm_first=c.norm_first,
        )
        if not c.norm_first:
            self.transformer.encoder.norm = None
            self.transformer.decoder.norm = None
        self.generator = nn.Linear(c.d_model, c.tgt_vocab_size, bias=False)
        self.generator.weight = token.weight
        self.pad_id = c.pad_id

    def forward(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        """Same contract as ``Transformer.forward``: logits ``(B, T, V)``."""
        src_pad = src == self.pad_id  # (B, S), True = ignore (nn.Transformer's polarity)
        T = tgt_in.size(1)
        causal = nn.Transformer.generate_square_subsequent_mask(T, device=src.device)
        h = self.transformer(
            self.src_embedding(src),
            self.tgt_embedding(tgt_in),
            tgt_mask=causal,
            src_key_padding_mask=src_pad,
            memory_key_padding_mask=src_pad,
            tgt_is_causal=True,
        )
        return self.generator(h)


# ----------------------------------------------------------------------------- command line


#: The model sizes of ``--quick`` (``train`` and ``decode``).
QUICK_MODEL = {"vocab": 64, "d_model": 32, "n_heads": 4, "d_ff": 64, "layers": 1}


def add_model_arguments(p: argparse.ArgumentParser) -> None:
    """The model sizes of :func:`model_config` (``train`` and ``decode``)."""
    p.add_argument("--vocab", type=int, default=8000, help="shared vocabulary size")
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--n-heads", type=int, default=8)
    p.add_argument("--d-ff", type=int, default=1024)
    p.add_argument("--layers", type=int, default=3, help="encoder and decoder layers each")


#: The options every subcommand takes (``all`` passes them on to each benchmark).
COMMON_OPTIONS = ("quick", "threads", "out", "out_dir", "format")


def add_common_arguments(p: argparse.ArgumentParser) -> None:
    """:data:`COMMON_OPTIONS`."""
    p.add_argument("--quick", action="store_true", help="tiny sizes: a smoke test in seconds")
    p.add_argument("--threads", type=int, default=2, help="torch intra-op threads (default 2)")
    p.add_argument(
        "--out", type=Path, default=None, help="JSON path (default OUT_DIR/<benchmark>.json)"
    )
    p.add_argument("--out-dir", type=Path, default=Path("bench_results"), help="JSON folder")
    p.add_argument(
        "--format", choices=["rich", "markdown"], default="rich", help="table output style"
    )


def add_profile_argument(p: argparse.ArgumentParser) -> None:
    """``--profile``, for the benchmarks that can add :func:`top_ops` tables."""
    p.add_argument("--profile", action="store_true", help="add torch.profiler top ops (slower)")


def add_plot_argument(p: argparse.ArgumentParser) -> None:
    """``--plot``, for the benchmarks that can draw their result."""
    p.add_argument("--plot", action="store_true", help="write a PNG next to the JSON")


# ----------------------------------------------------------------------------- output


def markdown_table(title: str, header: list[str], rows: list[list[str]]) -> str:
    """A GitHub markdown table with a bold title line."""
    lines = [f"**{title}**", "", "| " + " | ".join(header) + " |"]
    lines.append("|" + "|".join("---" for _ in header) + "|")
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def print_tables(tables: list[Table], fmt: str) -> None:
    """Print tables with rich (``fmt='rich'``) or as markdown (``fmt='markdown'``)."""
    if fmt == "markdown":
        for title, header, rows in tables:
            print(markdown_table(title, header, rows) + "\n")
        return
    from rich.console import Console
    from rich.table import Table as RichTable

    console = Console()
    for title, header, rows in tables:
        table = RichTable(title=title)
        for column in header:
            table.add_column(column, justify="right" if column != header[0] else "left")
        for row in rows:
            table.add_row(*row)
        console.print(table)


def write_json(result: dict[str, Any], path: Path) -> None:
    """Write ``result`` as indented JSON, creating the folder."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")


def generate(model: nn.Module, src: Tensor, *, bos_id: int, eos_id: int, search: Any) -> Tensor:
    """The best output of :func:`~transformer_mt.inference.search.search_batch` as ids
    ``(B, L)``: eos-ended, then padding (the shape other libraries' ``generate`` returns)."""
    from transformer_mt.inference.search import search_batch

    found = search_batch(model, src, bos_id=bos_id, eos_id=eos_id, search=search)
    best = [[*hyps[0].tokens, eos_id] for hyps in found]
    out = torch.full((len(best), max(map(len, best))), model.pad_id, dtype=torch.long)
    for b, ids in enumerate(best):
        out[b, : len(ids)] = torch.tensor(ids)
    return out.to(src.device)


def _malloc() -> str:
    """What malloc does with freed memory here: scripts/benchmark.py keeps it in the heap at
    start-up, as train.py does, where glibc runs and the environment does not say otherwise."""
    if allocator.user_chose():
        return "as the environment sets it"
    return "kept in the heap" if allocator.glibc() is not None else "the C library's default"
