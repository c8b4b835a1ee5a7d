"""Training-step benchmark: target tokens/s of our ``Transformer`` vs ``torch.nn.Transformer``.

Both models get the same embeddings, positional encodings and tied generator
(:class:`TorchTransformerMT`), the same synthetic batch and the same step (label-smoothed
cross-entropy, backward, Adam), so a difference comes from the encoder/decoder stacks alone.
Model FLOPs utilisation (MFU) is the analytic FLOPs of the padded batch
(:func:`training_flops`) over a matmul peak measured before and after the timed steps.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from bench.common import (
    PAD,
    QUICK_MODEL,
    Table,
    TorchTransformerMT,
    add_model_arguments,
    add_profile_argument,
    environment,
    goal,
    interleaved_times,
    matmul_peak_flops,
    median,
    model_config,
    parameter_count,
    profile_tables,
    synthetic_batch,
    top_ops,
)
from transformer_mt.model.transformer import ModelConfig, Transformer

NAME = "train"
HELP = "training-step tokens/s and MFU vs nn.Transformer"
#: One of the micro-benchmarks that ``benchmark.py all`` runs.
IN_ALL = True
QUICK = {**QUICK_MODEL, "batch": 4, "seq_len": 8, "repeats": 2, "matmul_n": 128}


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Options of ``benchmark.py train``."""
    add_model_arguments(p)
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument(
        "--attention-dropout",
        type=float,
        default=None,
        help="ours only; default = --dropout, as nn.Transformer uses one rate for both",
    )
    p.add_argument("--norm-first", action="store_true", help="pre-LN for both models")
    p.add_argument("--batch", type=int, default=128, help="sentences per batch")
    p.add_argument("--seq-len", type=int, default=32, help="padded length (src and tgt)")
    p.add_argument("--repeats", type=int, default=4)
    p.add_argument("--matmul-n", type=int, default=2048, help="size of the peak-FLOPs matmul")
    p.add_argument(
        "--compile",
        action="store_true",
        help="also time both models under torch.compile (compilation happens in the warmup)",
    )
    add_profile_argument(p)


def training_flops(config: ModelConfig, src: Tensor, tgt: Tensor) -> dict[str, Any]:
    """Analytic FLOPs of one training step over the padded batch (the work the kernels do).

    Forward FLOPs are 2 per multiply-add; backward costs twice the forward, so a training step
    is 3x the forward. Matmul parameters per token: encoder ``N_e (4 d^2 + 2 d d_ff)`` on each
    source position; decoder ``N_d (4 d^2 + 2 d^2 + 2 d d_ff) + d V`` on each target position
    (self-attention, cross-attention query/output, FFN, generator) and ``N_d 2 d^2`` on each
    source position (cross-attention key/value). Attention scores and weighted sums add
    ``2 * 2 * L_q * L_k * d`` forward per sequence and layer (full square, as SDPA computes it
    with a mask). Biases, LayerNorm, softmax and the optimizer are not counted.
    """
    d, ff, V = config.d_model, config.d_ff, config.tgt_vocab_size
    ne, nd = config.n_encoder_layers, config.n_decoder_layers
    B, S = src.shape
    T = tgt.size(1)
    enc_params = ne * (4 * d * d + 2 * d * ff)
    dec_params = nd * (6 * d * d + 2 * d * ff) + d * V
    cross_kv_params = nd * 2 * d * d
    matmul = 6 * (enc_params * B * S + dec_params * B * T + cross_kv_params * B * S)
    attention = 3 * 4 * B * d * (ne * S * S + nd * (T * T + T * S))
    return {
        "formula": (
            "6 * (P_enc * B*S + P_dec * B*T + P_crosskv * B*S) + 12 * B * d * "
            "(N_e * S^2 + N_d * (T^2 + T*S)); P_enc = N_e(4d^2 + 2 d d_ff), "
            "P_dec = N_d(6d^2 + 2 d d_ff) + d V, P_crosskv = N_d 2d^2; padded positions"
        ),
        "matmul_flops": matmul,
        "attention_flops": attention,
        "total_flops": matmul + attention,
    }


def _train_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    batch: tuple[Tensor, Tensor, Tensor],
    label_smoothing: float,
) -> Callable[[], None]:
    src, tgt_in, tgt_out = batch

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        logits = model(src, tgt_in)  # (B, T, V)
        loss = F.cross_entropy(
            logits.reshape(-1, logits.size(-1)),
            tgt_out.reshape(-1),
            ignore_index=PAD,
            label_smoothing=label_smoothing,
        )
        loss.backward()
        optimizer.step()

    return step


def _models(config: ModelConfig, compile_too: bool) -> dict[str, nn.Module]:
    """Ours and nn.Transformer in training mode, and both compiled if asked."""
    models: dict[str, nn.Module] = {
        "ours": Transformer(config).train(),
        "nn.Transformer": TorchTransformerMT(config).train(),
    }
    if compile_too:
        # Both compiled, so the comparison stays like for like; the goal is judged eager.
        for name in list(models):
            compiled = type(models[name])(config).train()
            compiled.load_state_dict(models[name].state_dict())
            compiled.compile()
            models[f"{name} (compiled)"] = compiled
    return models


def _per_model(
    models: dict[str, nn.Module],
    times: dict[str, list[float]],
    *,
    tokens: int,
    flops: float,
    peak_flops: float,
) -> dict[str, Any]:
    """Each model's step times, tokens/s, parameters and MFU."""
    per_model: dict[str, Any] = {}
    for name, model in models.items():
        t = median(times[name])
        per_model[name] = {
            "median_step_s": t,
            "min_step_s": min(times[name]),
            "times_s": times[name],
            "target_tokens_per_s": tokens / t,
            "parameters": parameter_count(model),
            "achieved_flops_per_s": flops / t,
            "mfu": flops / t / peak_flops,
        }
    return per_model


def _compiled_ratios(per_model: dict[str, Any]) -> dict[str, float]:
    """With --compile: ours vs nn.Transformer compiled, and ours compiled vs eager."""
    rate = {name: row["target_tokens_per_s"] for name, row in per_model.items()}
    return {
        "compiled_ours_vs_torch_tokens_per_s": rate["ours (compiled)"]
        / rate["nn.Transformer (compiled)"],
        "compiled_vs_eager_ours": rate["ours (compiled)"] / rate["ours"],
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Tokens/s of a full training step, ours vs nn.Transformer, plus MFU."""
    config = model_config(
        args,
        dropout=args.dropout,
        # nn.Transformer applies its one `dropout` to the attention weights too: match it.
        attention_dropout=args.dropout
        if args.attention_dropout is None
        else args.attention_dropout,
        norm_first=args.norm_first,
        max_len=max(256, args.seq_len),
    )
    gen = torch.Generator().manual_seed(0)
    batch = synthetic_batch(args.batch, args.seq_len, args.seq_len // 2, args.vocab, gen)
    models = _models(config, args.compile)
    steps = {
        name: _train_step(m, torch.optim.Adam(m.parameters(), lr=1e-4), batch, 0.1)
        for name, m in models.items()
    }
    peak = matmul_peak_flops(args.matmul_n)
    times = interleaved_times(steps, repeats=args.repeats, warmup=2)
    peak_after = matmul_peak_flops(args.matmul_n)  # the shared machine drifts: bracket it
    src, tgt_in, tgt_out = batch
    tokens = int((tgt_out != PAD).sum())
    flops = training_flops(config, src, tgt_in)
    peak_flops = max(peak["median_flops_per_s"], peak_after["median_flops_per_s"])
    per_model = _per_model(
        models, times, tokens=tokens, flops=flops["total_flops"], peak_flops=peak_flops
    )
    ours, torch_row = per_model["ours"], per_model["nn.Transformer"]
    speedup = ours["target_tokens_per_s"] / torch_row["target_tokens_per_s"]
    result: dict[str, Any] = {
        "benchmark": "train",
        "settings": {
            "model": config.to_dict(),
            "batch_sentences": args.batch,
            "padded_length": args.seq_len,
            "target_tokens": tokens,
            "source_tokens": int((src != PAD).sum()),
            "padded_positions": {"src": src.numel(), "tgt": tgt_in.numel()},
            "step": "forward, label-smoothed (0.1) cross-entropy ignoring pad, backward, Adam",
            "repeats": args.repeats,
            "quick": args.quick,
        },
        "matmul_peak": {"before": peak, "after": peak_after, "used_flops_per_s": peak_flops},
        "flops": flops,
        "models": per_model,
        "ours_vs_torch_tokens_per_s": speedup,
        # The fastest repeat is the least disturbed by other jobs: a noise check on the median.
        "ours_vs_torch_tokens_per_s_from_min": torch_row["min_step_s"] / ours["min_step_s"],
        "goals": [
            goal("ours tokens/s >= 1.1x nn.Transformer", speedup, 1.1),
            goal("ours MFU >= 0.60 (padded-batch FLOPs / measured matmul peak)", ours["mfu"], 0.6),
        ],
        "environment": environment(),
    }
    if args.compile:
        result.update(_compiled_ratios(per_model))
    if args.profile:
        result["profile"] = {name: top_ops(step) for name, step in steps.items()}
    return result


def tables(result: dict[str, Any]) -> list[Table]:
    header = ["model", "params", "step ms", "target tok/s", "GFLOP/s", "MFU"]
    rows = [
        [
            name,
            f"{m['parameters'] / 1e6:.2f}M",
            f"{1e3 * m['median_step_s']:.0f}",
            f"{m['target_tokens_per_s']:.0f}",
            f"{m['achieved_flops_per_s'] / 1e9:.1f}",
            f"{100 * m['mfu']:.1f}%",
        ]
        for name, m in result["models"].items()
    ]
    s, c = result["settings"], result["settings"]["model"]
    title = (
        f"Training step, d_model={c['d_model']} H={c['n_heads']} d_ff={c['d_ff']} "
        f"{c['n_encoder_layers']}+{c['n_decoder_layers']} layers, V={c['src_vocab_size']}, "
        f"{s['batch_sentences']}x{s['padded_length']} ({s['target_tokens']} target tokens); "
        f"matmul peak {result['matmul_peak']['used_flops_per_s'] / 1e9:.0f} GFLOP/s; "
        f"ours/torch = {result['ours_vs_torch_tokens_per_s']:.2f}x"
    )
    if "compiled_ours_vs_torch_tokens_per_s" in result:
        title += (
            f"; compiled ours/torch = {result['compiled_ours_vs_torch_tokens_per_s']:.2f}x, "
            f"ours compiled/eager = {result['compiled_vs_eager_ours']:.2f}x"
        )
    tables: list[Table] = [(title, header, rows)]
    tables += profile_tables(result.get("profile", {}), "training step")
    return tables
