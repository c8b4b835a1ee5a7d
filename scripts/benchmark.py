"""Benchmarks of transformer-mt against PyTorch and Hugging Face references (CPU, fp32).

Subcommands (``--help`` on each lists its options):

* ``attention``: forward+backward time and saved-activation memory of our
  ``MultiHeadAttention`` (fused and explicit) vs ``torch.nn.MultiheadAttention``.
* ``train``: target tokens/s of a full training step of our ``Transformer`` vs
  ``torch.nn.Transformer`` wrapped in the same embeddings and output layer; model FLOPs
  utilisation (MFU) against a measured matmul peak.
* ``decode``: sentences/s of greedy and beam search, with and without the KV cache, vs
  ``transformers.MarianMTModel.generate`` with a random model of the same dimensions.
* ``dropout``: forward+backward of ``torch.nn.functional.dropout`` vs ours
  (``transformer_mt.model.dropout``), alone and fused into the residual addition.
* ``all``: the four in a row.

Each writes ``bench_results/<name>.json`` (or ``--out``) with the settings, raw timings,
medians, goals (met or missed) and the environment, and prints a table (``--format
markdown`` for the README). ``--quick`` shrinks every size for a smoke run in seconds; its
numbers are not meaningful.

Example::

    .venv/bin/python scripts/benchmark.py all --format markdown --plot
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from bench_common import (
    SavedTensorBytes,
    Table,
    environment,
    goal,
    interleaved_times,
    matmul_peak_flops,
    median,
    parameter_count,
    print_tables,
    profile_tables,
    setup_torch,
    top_ops,
    write_json,
)
from transformer_mt.inference.search import beam_search, greedy_search
from transformer_mt.model.attention import MultiHeadAttention
from transformer_mt.model.embedding import TokenEmbedding, TransformerEmbedding
from transformer_mt.model.transformer import ModelConfig, Transformer

PAD, BOS, EOS = 0, 1, 2

# --------------------------------------------------------------------------------------------
# attention
# --------------------------------------------------------------------------------------------


def _attention_contenders(d_model: int, n_heads: int) -> dict[str, nn.Module]:
    """Three self-attention modules of the same size, in training mode, no dropout."""
    return {
        "ours_fused": MultiHeadAttention(d_model, n_heads, fused=True),
        "ours_explicit": MultiHeadAttention(d_model, n_heads, fused=False),
        "nn.MultiheadAttention": nn.MultiheadAttention(
            d_model, n_heads, dropout=0.0, batch_first=True
        ),
    }


def _attention_step(module: nn.Module, x: Tensor, grad: Tensor) -> Callable[[], None]:
    """One forward+backward of self-attention on ``x (B, L, d_model)``."""
    is_torch = isinstance(module, nn.MultiheadAttention)

    def step() -> None:
        for p in module.parameters():
            p.grad = None
        x.grad = None
        if is_torch:
            out = module(x, x, x, need_weights=False)[0]
        else:
            out = module(x, x, x)
        out.backward(grad)

    return step


def _saved_bytes(module: nn.Module, x: Tensor) -> int:
    """Bytes autograd keeps for backward in one forward of ``module`` (parameters excluded)."""
    with SavedTensorBytes(exclude=list(module.parameters())) as saved:
        if isinstance(module, nn.MultiheadAttention):
            module(x, x, x, need_weights=False)
        else:
            module(x, x, x)
    return saved.bytes


def run_attention(args: argparse.Namespace) -> dict[str, Any]:
    """Time and memory of the three attention implementations over sequence lengths."""
    modules = _attention_contenders(args.d_model, args.n_heads)
    rows: list[dict[str, Any]] = []
    for length in args.lengths:
        batch = max(1, args.tokens // length)
        x = torch.randn(batch, length, args.d_model, requires_grad=True)
        grad = torch.randn(batch, length, args.d_model)
        steps = {name: _attention_step(m, x, grad) for name, m in modules.items()}
        times = interleaved_times(steps, repeats=args.repeats, warmup=1)
        row: dict[str, Any] = {"length": length, "batch": batch}
        for name, m in modules.items():
            row[name] = {
                "median_ms": 1e3 * median(times[name]),
                "min_ms": 1e3 * min(times[name]),
                "times_s": times[name],
                "saved_bytes": _saved_bytes(m, x),
            }
        ref = row["nn.MultiheadAttention"]["median_ms"]
        row["fused_vs_torch_time"] = row["ours_fused"]["median_ms"] / ref
        row["explicit_vs_torch_time"] = row["ours_explicit"]["median_ms"] / ref
        rows.append(row)

    # The typical MT shape (batch 64, length 32) on its own, with more repeats.
    t_len, t_batch = args.typical
    x = torch.randn(t_batch, t_len, args.d_model, requires_grad=True)
    grad = torch.randn(t_batch, t_len, args.d_model)
    steps = {name: _attention_step(m, x, grad) for name, m in modules.items()}
    typical_times = interleaved_times(steps, repeats=args.typical_repeats, warmup=2)
    typical = {name: 1e3 * median(t) for name, t in typical_times.items()}
    typical_ratio = typical["ours_fused"] / typical["nn.MultiheadAttention"]

    growth = _memory_growth(rows)
    goals = [
        goal(
            f"fused time <= 0.9x nn.MultiheadAttention at B={t_batch}, L={t_len}, "
            f"d_model={args.d_model}, H={args.n_heads}",
            typical_ratio,
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
        "typical": {
            "length": t_len,
            "batch": t_batch,
            "repeats": args.typical_repeats,
            "median_ms": typical,
            "times_s": typical_times,
            "fused_vs_torch_time": typical_ratio,
        },
        "memory_growth": growth,
        "goals": goals,
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


def attention_tables(result: dict[str, Any]) -> list[Table]:
    names = ("ours_fused", "ours_explicit", "nn.MultiheadAttention")
    header = ["L", "B"] + [f"{n} ms" for n in names] + ["fused/torch", "explicit/torch"]
    header += [f"{n} MiB" for n in names]
    rows = []
    for r in result["rows"]:
        row = [str(r["length"]), str(r["batch"])]
        row += [f"{r[n]['median_ms']:.2f}" for n in names]
        row += [f"{r['fused_vs_torch_time']:.2f}x", f"{r['explicit_vs_torch_time']:.2f}x"]
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


# --------------------------------------------------------------------------------------------
# training step
# --------------------------------------------------------------------------------------------


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
        self.src_embedding = TransformerEmbedding(token, c.d_model, c.max_len, c.dropout)
        self.tgt_embedding = TransformerEmbedding(token, c.d_model, c.max_len, c.dropout)
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


def _synthetic_batch(
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


def _model_config(args: argparse.Namespace, **extra: Any) -> ModelConfig:
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


def run_train(args: argparse.Namespace) -> dict[str, Any]:
    """Tokens/s of a full training step, ours vs nn.Transformer, plus MFU."""
    config = _model_config(
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
    batch = _synthetic_batch(args.batch, args.seq_len, args.seq_len // 2, args.vocab, gen)
    models: dict[str, nn.Module] = {
        "ours": Transformer(config).train(),
        "nn.Transformer": TorchTransformerMT(config).train(),
    }
    if args.compile:
        # Both compiled, so the comparison stays like for like; the goal is judged eager.
        for name in list(models):
            compiled = type(models[name])(config).train()
            compiled.load_state_dict(models[name].state_dict())
            compiled.compile()
            models[f"{name} (compiled)"] = compiled
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
    per_model: dict[str, Any] = {}
    for name, model in models.items():
        t = median(times[name])
        per_model[name] = {
            "median_step_s": t,
            "min_step_s": min(times[name]),
            "times_s": times[name],
            "target_tokens_per_s": tokens / t,
            "parameters": parameter_count(model),
            "achieved_flops_per_s": flops["total_flops"] / t,
            "mfu": flops["total_flops"] / t / peak_flops,
        }
    speedup = (
        per_model["ours"]["target_tokens_per_s"]
        / per_model["nn.Transformer"]["target_tokens_per_s"]
    )
    # The fastest repeat is the least disturbed by other jobs: a noise check on the median.
    speedup_min = per_model["nn.Transformer"]["min_step_s"] / per_model["ours"]["min_step_s"]
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
        "ours_vs_torch_tokens_per_s_from_min": speedup_min,
        "goals": [
            goal("ours tokens/s >= 1.1x nn.Transformer", speedup, 1.1),
            goal(
                "ours MFU >= 0.60 (padded-batch FLOPs / measured matmul peak)",
                per_model["ours"]["mfu"],
                0.6,
            ),
        ],
        "environment": environment(),
    }
    if args.compile:
        result["compiled_ours_vs_torch_tokens_per_s"] = (
            per_model["ours (compiled)"]["target_tokens_per_s"]
            / per_model["nn.Transformer (compiled)"]["target_tokens_per_s"]
        )
        result["compiled_vs_eager_ours"] = (
            per_model["ours (compiled)"]["target_tokens_per_s"]
            / per_model["ours"]["target_tokens_per_s"]
        )
    if args.profile:
        result["profile"] = {name: top_ops(step) for name, step in steps.items()}
    return result


def train_tables(result: dict[str, Any]) -> list[Table]:
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


# --------------------------------------------------------------------------------------------
# decoding
# --------------------------------------------------------------------------------------------

#: Finite (not -inf), so that the eos forced at the length cap keeps a finite beam score.
_EOS_SUPPRESSION = -1e4


def _suppress_eos_hook(module: nn.Module, inputs: Any, output: Tensor) -> None:
    output[..., EOS] = _EOS_SUPPRESSION  # a random model must not stop early


def _marian(config: ModelConfig) -> nn.Module | None:
    """A randomly initialised ``MarianMTModel`` with our dimensions; None without transformers."""
    try:
        from transformers import MarianConfig, MarianMTModel
        from transformers.utils import logging as hf_logging
    except ImportError:
        return None
    hf_logging.set_verbosity_error()
    hf_config = MarianConfig(
        vocab_size=config.tgt_vocab_size,
        d_model=config.d_model,
        encoder_layers=config.n_encoder_layers,
        decoder_layers=config.n_decoder_layers,
        encoder_attention_heads=config.n_heads,
        decoder_attention_heads=config.n_heads,
        encoder_ffn_dim=config.d_ff,
        decoder_ffn_dim=config.d_ff,
        activation_function=config.activation,
        max_position_embeddings=config.max_len,
        pad_token_id=PAD,
        eos_token_id=EOS,
        decoder_start_token_id=PAD,  # Marian starts decoding with the pad token
        forced_eos_token_id=EOS,
        dropout=config.dropout,
    )
    return MarianMTModel(hf_config).eval()


def run_decode(args: argparse.Namespace) -> dict[str, Any]:
    """Sentences/s of greedy and beam search, cached and uncached, vs Marian ``generate``."""
    config = _model_config(
        args,
        max_len=max(256, args.new_tokens + 2, args.src_len),
    )
    model = Transformer(config).eval()
    model.generator.register_forward_hook(_suppress_eos_hook)
    marian = _marian(config)
    gen = torch.Generator().manual_seed(0)
    src, _, _ = _synthetic_batch(args.batch, args.src_len, args.src_len // 2, args.vocab, gen)
    n_new = args.new_tokens
    # max_len_a=0, max_len_b=n: every sentence is capped at exactly n tokens (eos at the cap)
    # and, with eos suppressed before it, runs all n decoder steps.
    common = {"bos_id": BOS, "eos_id": EOS, "max_len_a": 0.0, "max_len_b": n_new}

    def ours(beam: int, cache: bool, rows: Tensor) -> Callable[[], Tensor]:
        if beam == 1:
            return lambda: greedy_search(model, rows, use_cache=cache, **common)
        return lambda: beam_search(model, rows, beam_size=beam, use_cache=cache, **common)[0]

    def hf(beam: int) -> Callable[[], Tensor]:
        assert marian is not None
        attention_mask = (src != PAD).long()

        def call() -> Tensor:
            with torch.no_grad():
                return marian.generate(
                    input_ids=src,
                    attention_mask=attention_mask,
                    num_beams=beam,
                    do_sample=False,
                    max_new_tokens=n_new,
                    min_new_tokens=n_new,  # eos suppressed until the last step, like ours
                )

        return call

    # Recomputing the prefix costs O(n^2) decoder positions: the cache comparison runs on the
    # first `uncached_batch` sentences, cached and uncached alike.
    small = src[: args.uncached_batch]
    contenders: dict[str, Callable[[], Tensor]] = {}
    batch_of: dict[str, int] = {}
    for beam in args.beams:
        contenders[f"ours_cached_k{beam}"] = ours(beam, True, src)
        batch_of[f"ours_cached_k{beam}"] = src.size(0)
        if marian is not None:
            contenders[f"hf_marian_k{beam}"] = hf(beam)
            batch_of[f"hf_marian_k{beam}"] = src.size(0)
        for cache in (True, False):
            name = f"ours_{'cached' if cache else 'uncached'}_k{beam}_b{small.size(0)}"
            contenders[name] = ours(beam, cache, small)
            batch_of[name] = small.size(0)

    lengths: dict[str, int] = {}

    def recording(name: str, fn: Callable[[], Tensor]) -> Callable[[], None]:
        def call() -> None:
            # Generated tokens per sentence; HF's output starts with the decoder start token.
            lengths[name] = int(fn().size(1)) - int(name.startswith("hf_"))

        return call

    timed = {name: recording(name, fn) for name, fn in contenders.items()}
    for name, fn in timed.items():  # warm-up, except the slow uncached runs
        if "uncached" not in name:
            fn()
    repeats_per = {n: args.uncached_repeats for n in contenders if "uncached" in n}
    times = interleaved_times(timed, args.repeats, warmup=0, repeats_per=repeats_per)

    rows: dict[str, Any] = {}
    for name, t in times.items():
        rows[name] = {
            "batch": batch_of[name],
            "median_s": median(t),
            "min_s": min(t),
            "times_s": t,
            "sentences_per_s": batch_of[name] / median(t),
            "output_length": lengths[name],
        }
    goals = []
    b_small = small.size(0)
    for beam in args.beams:
        cached = rows[f"ours_cached_k{beam}"]["sentences_per_s"]
        goals.append(
            goal(
                f"beam {beam}: cached >= 3x uncached at {n_new} output tokens (batch {b_small})",
                rows[f"ours_cached_k{beam}_b{b_small}"]["sentences_per_s"]
                / rows[f"ours_uncached_k{beam}_b{b_small}"]["sentences_per_s"],
                3.0,
            )
        )
        if marian is not None:
            goals.append(
                goal(
                    f"beam {beam}: ours (cached) >= 2x HF MarianMTModel.generate",
                    cached / rows[f"hf_marian_k{beam}"]["sentences_per_s"],
                    2.0,
                )
            )
    result: dict[str, Any] = {
        "benchmark": "decode",
        "settings": {
            "model": config.to_dict(),
            "parameters_ours": parameter_count(model),
            "parameters_hf": parameter_count(marian) if marian is not None else None,
            "batch": args.batch,
            "uncached_batch": b_small,
            "source_length_padded": args.src_len,
            "new_tokens": n_new,
            "beams": args.beams,
            "repeats": args.repeats,
            "uncached_repeats": args.uncached_repeats,
            "forcing": (
                "ours: eos logit set to -1e4 by a forward hook on the generator, "
                f"max_len_a=0, max_len_b={n_new} (eos forced at step {n_new}); "
                f"HF: min_new_tokens=max_new_tokens={n_new}, forced_eos_token_id=eos"
            ),
            "mode": "eval, torch.no_grad, fp32, random weights",
            "quick": args.quick,
        },
        "hf_available": marian is not None,
        "hf_note": None if marian is not None else "transformers is not installed: skipped",
        "rows": rows,
        "goals": goals,
        "environment": environment(),
    }
    if marian is not None:
        import transformers

        result["settings"]["transformers"] = transformers.__version__
        result["settings"]["hf_attn_implementation"] = marian.config._attn_implementation
    if args.profile:
        result["profile"] = {
            name: top_ops(contenders[name], calls=1)
            for name in contenders
            if name.startswith(("ours_cached", "hf_")) and "_b" not in name
        }
    return result


def decode_tables(result: dict[str, Any]) -> list[Table]:
    s, r = result["settings"], result["rows"]
    b, bs = s["batch"], s["uncached_batch"]
    header = [
        "search",
        f"ours cached B={b}",
        f"ours cached B={bs}",
        f"ours uncached B={bs}",
        "cached/uncached",
    ]
    if result["hf_available"]:
        header += [f"HF Marian B={b}", "ours/HF"]
    rows = []
    for beam in s["beams"]:
        c = r[f"ours_cached_k{beam}"]["sentences_per_s"]
        cs = r[f"ours_cached_k{beam}_b{bs}"]["sentences_per_s"]
        us = r[f"ours_uncached_k{beam}_b{bs}"]["sentences_per_s"]
        row = ["greedy" if beam == 1 else f"beam {beam}", f"{c:.1f}", f"{cs:.1f}", f"{us:.2f}"]
        row.append(f"{cs / us:.1f}x")
        if result["hf_available"]:
            h = r[f"hf_marian_k{beam}"]["sentences_per_s"]
            row += [f"{h:.1f}", f"{c / h:.2f}x"]
        rows.append(row)
    title = (
        f"Decoding sentences/s, {s['new_tokens']} output tokens, "
        f"source <= {s['source_length_padded']} tokens"
    )
    if not result["hf_available"]:
        title += f" ({result['hf_note']})"
    tables: list[Table] = [(title, header, rows)]
    tables += profile_tables(result.get("profile", {}), "search call")
    return tables


# --------------------------------------------------------------------------------------------
# dropout
# --------------------------------------------------------------------------------------------


def _dropout_contenders(tokens: int, width: int, p: float) -> dict[str, Callable[[], None]]:
    """Forward+backward callables: torch's dropout vs ours, alone and in a residual."""
    from transformer_mt.model.dropout import Dropout

    gen = torch.Generator().manual_seed(0)
    x = torch.randn(tokens, width, generator=gen, requires_grad=True)
    residual = torch.randn(tokens, width, generator=gen, requires_grad=True)
    ours = Dropout(p).train()

    def fwd_bwd(fn: Callable[[], Tensor]) -> Callable[[], None]:
        def step() -> None:
            fn().sum().backward()
            x.grad = residual.grad = None

        return step

    return {
        "F.dropout": fwd_bwd(lambda: F.dropout(x, p, True)),
        "ours": fwd_bwd(lambda: ours(x)),
        "x + F.dropout": fwd_bwd(lambda: residual + F.dropout(x, p, True)),
        "ours.add": fwd_bwd(lambda: ours.add(residual, x)),
    }


#: Activation shapes (tokens x width) of ``dropout`` when ``--shapes`` is not given.
DROPOUT_SHAPES = [[2048, 256], [2048, 512], [4096, 1024]]


def run_dropout(args: argparse.Namespace) -> dict[str, Any]:
    """Forward+backward time of torch's dropout vs ours, alone and fused into the residual."""
    shapes = args.shapes or DROPOUT_SHAPES  # append-style options cannot carry a default
    rows: dict[str, Any] = {}
    for tokens, width in shapes:
        contenders = _dropout_contenders(tokens, width, args.p)
        times = interleaved_times(contenders, repeats=args.repeats, warmup=2)
        med = {name: median(t) for name, t in times.items()}
        rows[f"{tokens}x{width}"] = {
            "median_s": med,
            "times_s": times,
            "speedup_dropout": med["F.dropout"] / med["ours"],
            "speedup_residual": med["x + F.dropout"] / med["ours.add"],
        }
    return {
        "benchmark": "dropout",
        "settings": {"p": args.p, "shapes": shapes, "repeats": args.repeats},
        "rows": rows,
        "goals": [],
        "environment": environment(),
    }


def dropout_tables(result: dict[str, Any]) -> list[Table]:
    header = [
        "tokens x width",
        "F.dropout ms",
        "ours ms",
        "speed-up",
        "x + F.dropout ms",
        "ours.add ms",
        "speed-up",
    ]
    rows = [
        [
            shape,
            f"{1e3 * r['median_s']['F.dropout']:.2f}",
            f"{1e3 * r['median_s']['ours']:.2f}",
            f"{r['speedup_dropout']:.2f}x",
            f"{1e3 * r['median_s']['x + F.dropout']:.2f}",
            f"{1e3 * r['median_s']['ours.add']:.2f}",
            f"{r['speedup_residual']:.2f}x",
        ]
        for shape, r in result["rows"].items()
    ]
    title = f"Dropout p={result['settings']['p']}, forward + backward, median"
    return [(title, header, rows)]


# --------------------------------------------------------------------------------------------
# command line
# --------------------------------------------------------------------------------------------

_RUNNERS = {
    "attention": (run_attention, attention_tables),
    "train": (run_train, train_tables),
    "decode": (run_decode, decode_tables),
    "dropout": (run_dropout, dropout_tables),
}

#: Settings that ``--quick`` overrides: a smoke run in seconds, numbers not meaningful.
_QUICK = {
    "attention": {
        "d_model": 32, "n_heads": 4, "lengths": [8, 32], "tokens": 64,
        "repeats": 2, "typical": [8, 4], "typical_repeats": 2,
    },
    "train": {
        "vocab": 64, "d_model": 32, "n_heads": 4, "d_ff": 64, "layers": 1,
        "batch": 4, "seq_len": 8, "repeats": 2, "matmul_n": 128,
    },
    "decode": {
        "vocab": 64, "d_model": 32, "n_heads": 4, "d_ff": 64, "layers": 1,
        "batch": 2, "src_len": 6, "new_tokens": 4, "beams": [1, 2], "repeats": 1,
        "uncached_repeats": 1, "uncached_batch": 2,
    },
    "dropout": {"shapes": [[16, 8]], "repeats": 2},
}  # fmt: skip


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quick", action="store_true", help="tiny sizes: a smoke test in seconds")
    p.add_argument("--threads", type=int, default=2, help="torch intra-op threads (default 2)")
    p.add_argument("--out", type=Path, default=None, help="JSON path (default bench_results/)")
    p.add_argument("--out-dir", type=Path, default=Path("bench_results"), help="JSON folder")
    p.add_argument(
        "--format", choices=["rich", "markdown"], default="rich", help="table output style"
    )
    p.add_argument("--profile", action="store_true", help="add torch.profiler top ops (slower)")
    p.add_argument("--plot", action="store_true", help="write a PNG next to the JSON")


def _add_attention(p: argparse.ArgumentParser) -> None:
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


def _add_model(p: argparse.ArgumentParser) -> None:
    p.add_argument("--vocab", type=int, default=8000, help="shared vocabulary size")
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--n-heads", type=int, default=8)
    p.add_argument("--d-ff", type=int, default=1024)
    p.add_argument("--layers", type=int, default=3, help="encoder and decoder layers each")


def _add_train(p: argparse.ArgumentParser) -> None:
    _add_model(p)
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


def _add_decode(p: argparse.ArgumentParser) -> None:
    _add_model(p)
    p.add_argument("--batch", type=int, default=64, help="source sentences")
    p.add_argument("--src-len", type=int, default=32, help="padded source length")
    p.add_argument("--new-tokens", type=int, default=64, help="output tokens per sentence")
    p.add_argument("--beams", type=int, nargs="+", default=[1, 5], help="1 = greedy")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument(
        "--uncached-repeats", type=int, default=1, help="repeats of the slow uncached runs"
    )
    p.add_argument(
        "--uncached-batch",
        type=int,
        default=16,
        help="sentences for the cached-vs-uncached comparison (uncached is O(n^2) in steps)",
    )


def _add_dropout(p: argparse.ArgumentParser) -> None:
    p.add_argument("--p", type=float, default=0.2, help="dropout probability")
    p.add_argument(
        "--shapes",
        type=int,
        nargs=2,
        action="append",
        default=None,
        metavar=("TOKENS", "WIDTH"),
        help="activation shapes (repeatable; default 2048x256, 2048x512, 4096x1024)",
    )
    p.add_argument("--repeats", type=int, default=15)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    specs = {
        "attention": (_add_attention, "attention fwd+bwd time and memory vs length"),
        "train": (_add_train, "training-step tokens/s and MFU vs nn.Transformer"),
        "decode": (_add_decode, "greedy/beam sentences/s vs no cache and HF Marian"),
        "dropout": (_add_dropout, "dropout and dropout+residual: ours vs torch"),
    }
    for name, (add, help_text) in specs.items():
        p = sub.add_parser(name, help=help_text)
        add(p)
        _add_common(p)
    p_all = sub.add_parser("all", help="attention, train, decode and dropout with their defaults")
    _add_common(p_all)
    return parser


def _namespace_for(name: str, args: argparse.Namespace) -> argparse.Namespace:
    """Defaults of subcommand ``name`` overlaid with the common options of ``args``."""
    parser = argparse.ArgumentParser()
    adders = {
        "attention": _add_attention,
        "train": _add_train,
        "decode": _add_decode,
        "dropout": _add_dropout,
    }
    adders[name](parser)
    ns = parser.parse_args([])
    for key in ("quick", "threads", "out", "out_dir", "format", "profile", "plot"):
        setattr(ns, key, getattr(args, key))
    return ns


def run_one(name: str, args: argparse.Namespace) -> dict[str, Any]:
    """Run benchmark ``name``, print its tables and write its JSON; return the result."""
    if args.quick:
        for key, value in _QUICK[name].items():
            setattr(args, key, value)
    args.out_path = args.out if args.out is not None else args.out_dir / f"{name}.json"
    setup_torch(args.threads)
    runner, tables = _RUNNERS[name]
    result = runner(args)
    print_tables(tables(result), args.format)
    for g in result["goals"]:
        mark = "MET " if g["met"] else "MISS"
        print(f"[{mark}] {g['goal']}: {g['value']} (target {g['comparison']} {g['target']})")
    write_json(result, args.out_path)
    print(f"wrote {args.out_path}")
    return result


def main(argv: list[str] | None = None) -> dict[str, dict[str, Any]]:
    args = build_parser().parse_args(argv)
    if args.command != "all":
        return {args.command: run_one(args.command, args)}
    if args.out is not None:
        args.out_dir = args.out  # with `all`, --out names the folder
    args.out = None
    return {name: run_one(name, _namespace_for(name, args)) for name in _RUNNERS}


if __name__ == "__main__":
    main(sys.argv[1:])
