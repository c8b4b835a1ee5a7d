"""Attention benchmark: forward+backward time and saved-activation memory vs sequence length.

Our ``MultiHeadAttention``, fused (``F.scaled_dot_product_attention``, as fp32 training runs it)
and explicit (the paper's equation written out), against ``torch.nn.MultiheadAttention``, at a
fixed number of tokens per batch, plus the typical MT shape on its own with more repeats.
Memory is the bytes autograd saves for backward (:class:`bench.common.SavedTensorBytes`).
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from bench.common import (
    SavedTensorBytes,
    Table,
    add_plot_argument,
    environment,
    goal,
    interleaved_times,
    median,
)
from transformer_mt.model.attention import MultiHeadAttention
from transformer_mt.model.config import ModelConfig

NAME = "attention"
HELP = "attention fwd+bwd time and memory vs length"
#: One of the micro-benchmarks that ``benchmark.py all`` runs.
IN_ALL = True
#: Settings that ``--quick`` overrides: a smoke run in seconds, numbers not meaningful.
QUICK = {
    "d_model": 32, "n_heads": 4, "lengths": [8, 32], "tokens": 64,
    "repeats": 2, "typical": [8, 4], "typical_repeats": 2,
}  # fmt: skip


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Options of ``benchmark.py attention``."""
    p.add_argument("--d-model", type=int, default=512)
    p.add_argument("--n-heads", type=int, default=8)
    p.add_argument(
        "--lengths",
        type=int,
        nargs="+",
        default=[16, 32, 64, 128, 256, 512, 1024],
        help="sequence lengths to sweep",
    )
    p.add_argument(
        "--tokens", type=int, default=2048, help="tokens per batch: batch = tokens // length"
    )
    p.add_argument("--repeats", type=int, default=3, help="timed repeats per length")
    p.add_argument(
        "--typical",
        type=int,
        nargs=2,
        default=[32, 64],
        metavar=("LENGTH", "BATCH"),
        help="the shape the 0.9x goal is judged at",
    )
    p.add_argument("--typical-repeats", type=int, default=11)
    add_plot_argument(p)


def _attention_contenders(d_model: int, n_heads: int) -> dict[str, nn.Module]:
    """Three self-attention modules of the same size, in training mode, no dropout."""

    def ours(fused: bool) -> MultiHeadAttention:
        # Sized as the model sizes its layers; a one-token vocabulary since none is used.
        config = ModelConfig(1, 1, d_model=d_model, n_heads=n_heads, fused_attention=fused)
        return MultiHeadAttention(config.attention)

    return {
        "ours_fused": ours(fused=True),
        "ours_explicit": ours(fused=False),
        "nn.MultiheadAttention": nn.MultiheadAttention(
            d_model, n_heads, dropout=0.0, batch_first=True
        ),
    }


def _attention_step(name: str, module: nn.Module, x: Tensor, grad: Tensor) -> Callable[[], None]:
    """One forward+backward of contender ``name``'s self-attention on ``x (B, L, d_model)``."""
    is_torch = isinstance(module, nn.MultiheadAttention)

    def step() -> None:
        for p in module.parameters():
            p.grad = None
        x.grad = None
        if is_torch:
            out = module(x, x, x, need_weights=False)[0]
        else:
            out = module(x)  # self-attention
        out.backward(grad)

    return step


def _saved_bytes(name: str, module: nn.Module, x: Tensor) -> int:
    """Bytes autograd keeps for backward in one forward of contender ``name`` (parameters
    excluded)."""
    with SavedTensorBytes(exclude=list(module.parameters())) as saved:
        if isinstance(module, nn.MultiheadAttention):
            module(x, x, x, need_weights=False)
        else:
            module(x)
    return saved.bytes


def _steps(modules: dict[str, nn.Module], x: Tensor, grad: Tensor) -> dict[str, Callable[[], None]]:
    return {name: _attention_step(name, m, x, grad) for name, m in modules.items()}


def _length_row(modules: dict[str, nn.Module], length: int, args: argparse.Namespace) -> dict:
    """Times and saved bytes of every implementation at one sequence length."""
    batch = max(1, args.tokens // length)
    x = torch.randn(batch, length, args.d_model, requires_grad=True)
    grad = torch.randn(batch, length, args.d_model)
    times = interleaved_times(_steps(modules, x, grad), repeats=args.repeats, warmup=1)
    row: dict[str, Any] = {"length": length, "batch": batch}
    for name, m in modules.items():
        row[name] = {
            "median_ms": 1e3 * median(times[name]),
            "min_ms": 1e3 * min(times[name]),
            "times_s": times[name],
            "saved_bytes": _saved_bytes(name, m, x),
        }
    ref = row["nn.MultiheadAttention"]["median_ms"]
    row["fused_vs_torch_time"] = row["ours_fused"]["median_ms"] / ref
    row["explicit_vs_torch_time"] = row["ours_explicit"]["median_ms"] / ref
    return row


def _typical(modules: dict[str, nn.Module], args: argparse.Namespace) -> dict[str, Any]:
    """The typical MT shape (batch 64, length 32) on its own, with more repeats."""
    t_len, t_batch = args.typical
    x = torch.randn(t_batch, t_len, args.d_model, requires_grad=True)
    grad = torch.randn(t_batch, t_len, args.d_model)
    typical_times = interleaved_times(
        _steps(modules, x, grad), repeats=args.typical_repeats, warmup=2
    )
    typical = {name: 1e3 * median(t) for name, t in typical_times.items()}
    return {
        "length": t_len,
        "batch": t_batch,
        "repeats": args.typical_repeats,
        "median_ms": typical,
        "times_s": typical_times,
        "fused_vs_torch_time": typical["ours_fused"] / typical["nn.MultiheadAttention"],
    }


def _goals(typical: dict[str, Any], growth: dict[str, Any], args: argparse.Namespace) -> list:
    return [
        goal(
            f"fused time <= 0.9x nn.MultiheadAttention at B={typical['batch']}, "
            f"L={typical['length']}, d_model={args.d_model}, H={args.n_heads}",
            typical["fused_vs_torch_time"],
            0.9,
            higher_is_better=False,
        ),
        goal(
            "fused saved memory per sequence grows linearly in L (log-log exponent ~ 1)",
            growth["ours_fused"]["exponent"],
            1.1,
            higher_is_better=False,
        ),
        goal(
            "explicit saved memory per sequence grows quadratically in L (exponent -> 2)",
            growth["ours_explicit"]["exponent"],
            1.5,
        ),
    ]


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Time and memory of the three attention implementations over sequence lengths."""
    modules = _attention_contenders(args.d_model, args.n_heads)
    rows = [_length_row(modules, length, args) for length in args.lengths]
    typical = _typical(modules, args)
    growth = _memory_growth(rows)
    result = {
        "benchmark": "attention",
        "settings": {
            "d_model": args.d_model,
            "n_heads": args.n_heads,
            "tokens_per_batch": args.tokens,
            "lengths": args.lengths,
            "repeats": args.repeats,
            "dtype": "float32",
            "mode": "train (forward + backward), self-attention, no mask, dropout 0",
            "memory_method": (
                "bytes of tensors saved for backward (torch.autograd.graph.saved_tensors_hooks, "
                "each storage once, parameters excluded): the activation memory held between "
                "forward and backward; deterministic on a shared CPU"
            ),
            "quick": args.quick,
        },
        "rows": rows,
        "typical": typical,
        "memory_growth": growth,
        "goals": _goals(typical, growth, args),
        "environment": environment(),
    }
    if args.plot:
        result["plot"] = str(_plot_attention(rows, args.out_path.with_suffix(".png")))
    return result


def _memory_growth(rows: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """How saved bytes per sequence grow with length L, per implementation.

    ``exponent``: log-log slope between the two longest lengths (1 = linear, 2 = quadratic).
    ``linear_bytes`` and ``quadratic_bytes``: least-squares fit ``bytes/seq = a L + b L^2``
    over all lengths; ``b`` is the bytes per query-key pair (4 * H for one fp32
    ``(H, L, L)`` tensor).
    """
    growth = {}
    lengths = torch.tensor([float(r["length"]) for r in rows], dtype=torch.float64)
    design = torch.stack([lengths, lengths**2], dim=1)  # (n, 2)
    for name in ("ours_fused", "ours_explicit", "nn.MultiheadAttention"):
        per_seq = [r[name]["saved_bytes"] / r["batch"] for r in rows]
        exponent = math.log(per_seq[-1] / per_seq[-2]) / math.log(
            rows[-1]["length"] / rows[-2]["length"]
        )
        target = torch.tensor(per_seq, dtype=torch.float64)[:, None]
        a, b = torch.linalg.lstsq(design, target).solution.flatten().tolist()
        growth[name] = {"exponent": exponent, "linear_bytes": a, "quadratic_bytes": b}
    return growth


def _plot_attention(rows: list[dict[str, Any]], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lengths = [r["length"] for r in rows]
    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(10, 4))
    for name in ("ours_fused", "ours_explicit", "nn.MultiheadAttention"):
        ax_t.plot(lengths, [r[name]["median_ms"] for r in rows], marker="o", label=name)
        ax_m.plot(lengths, [r[name]["saved_bytes"] / 2**20 for r in rows], marker="o", label=name)
    ax_t.set(xscale="log", yscale="log", xlabel="length", ylabel="fwd+bwd ms")
    ax_m.set(xscale="log", yscale="log", xlabel="length", ylabel="saved for backward (MiB)")
    ax_t.set_title(f"fixed tokens per batch ({rows[0]['batch'] * rows[0]['length']})")
    ax_m.set_title("activation memory")
    ax_t.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def tables(result: dict[str, Any]) -> list[Table]:
    names = ("ours_fused", "ours_explicit", "nn.MultiheadAttention")
    header = ["L", "B"] + [f"{n} ms" for n in names]
    header += ["fused/torch", "explicit/torch"] + [f"{n} MiB" for n in names]
    rows = []
    for r in result["rows"]:
        row = [str(r["length"]), str(r["batch"])]
        row += [f"{r[n]['median_ms']:.2f}" for n in names]
        ratios = ("fused_vs_torch_time", "explicit_vs_torch_time")
        row += [f"{r[key]:.2f}x" for key in ratios]
        row += [f"{r[n]['saved_bytes'] / 2**20:.1f}" for n in names]
        rows.append(row)
    s = result["settings"]
    title = (
        f"Attention forward+backward, d_model={s['d_model']}, H={s['n_heads']}, "
        f"{s['tokens_per_batch']} tokens/batch (median ms; memory saved for backward)"
    )
    t = result["typical"]
    typical_rows = [[n, f"{t['median_ms'][n]:.2f}"] for n in names]
    typical_title = (
        f"Typical MT shape B={t['batch']} L={t['length']} (median of {t['repeats']}), "
        f"fused/torch = {t['fused_vs_torch_time']:.2f}x"
    )
    growth_rows = [
        [
            n,
            f"{g['exponent']:.2f}",
            f"{g['linear_bytes'] / 1024:.1f}",
            f"{g['quadratic_bytes']:.1f}",
        ]
        for n, g in result["memory_growth"].items()
    ]
    growth_title = "Saved memory per sequence ~ a L + b L^2 (exponent: log-log slope, last 2 L)"
    return [
        (title, header, rows),
        (typical_title, ["module", "ms"], typical_rows),
        (growth_title, ["module", "exponent", "a (KiB/token)", "b (bytes/L^2)"], growth_rows),
    ]
