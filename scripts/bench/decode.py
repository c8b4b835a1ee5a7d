"""Decoding benchmark: sentences/s of greedy and beam search, with and without the KV cache,
vs ``transformers.MarianMTModel.generate`` with a random model of the same dimensions.

Random weights would stop at a random step, so the eos logit is suppressed until the length cap:
every contender runs exactly ``--new-tokens`` decoder steps. Without ``transformers`` installed
the Marian rows are skipped (the JSON says so).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from bench.common import (
    BOS,
    EOS,
    PAD,
    QUICK_MODEL,
    Table,
    add_model_arguments,
    add_profile_argument,
    environment,
    generate,
    goal,
    interleaved_times,
    median,
    model_config,
    parameter_count,
    profile_tables,
    synthetic_batch,
    top_ops,
)
from transformer_mt.inference.search import SearchConfig
from transformer_mt.model.transformer import ModelConfig, Transformer

NAME = "decode"
HELP = "greedy/beam sentences/s vs no cache and HF Marian"
#: One of the micro-benchmarks that ``benchmark.py all`` runs.
IN_ALL = True
QUICK = {
    **QUICK_MODEL, "batch": 2, "src_len": 6, "new_tokens": 4, "beams": [1, 2], "repeats": 1,
    "uncached_repeats": 1, "uncached_batch": 2,
}  # fmt: skip


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Options of ``benchmark.py decode``."""
    add_model_arguments(p)
    add_profile_argument(p)
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


class _Contenders:
    """Our searches (cached and uncached) and Marian ``generate`` on one random source batch.

    ``calls`` maps a contender to one decoding call, ``batch_of`` to its number of sentences.
    Recomputing the prefix costs O(n^2) decoder positions: the cache comparison runs on the
    first ``uncached_batch`` sentences, cached and uncached alike.
    """

    def __init__(self, args: argparse.Namespace, model: nn.Module, marian: nn.Module | None):
        gen = torch.Generator().manual_seed(0)
        self.src, _, _ = synthetic_batch(
            args.batch, args.src_len, args.src_len // 2, args.vocab, gen
        )
        self.small = self.src[: args.uncached_batch]
        self.model, self.marian, self.n_new = model, marian, args.new_tokens
        self.calls: dict[str, Callable[[], Tensor]] = {}
        self.batch_of: dict[str, int] = {}
        for beam in args.beams:
            self._add(f"ours_cached_k{beam}", self.ours(beam, True, self.src), self.src)
            if marian is not None:
                self._add(f"hf_marian_k{beam}", self.hf(beam), self.src)
            for cache in (True, False):
                name = f"ours_{'cached' if cache else 'uncached'}_k{beam}_b{self.small.size(0)}"
                self._add(name, self.ours(beam, cache, self.small), self.small)

    def _add(self, name: str, call: Callable[[], Tensor], rows: Tensor) -> None:
        self.calls[name], self.batch_of[name] = call, rows.size(0)

    def ours(self, beam: int, cache: bool, rows: Tensor) -> Callable[[], Tensor]:
        # max_len_a=0, max_len_b=n: every sentence is capped at exactly n tokens (eos at the
        # cap) and, with eos suppressed before it, runs all n decoder steps.
        search = SearchConfig(beam_size=beam, max_len_a=0.0, max_len_b=self.n_new, use_cache=cache)
        model = self.model
        return lambda: generate(model, rows, bos_id=BOS, eos_id=EOS, search=search)

    def hf(self, beam: int) -> Callable[[], Tensor]:
        assert self.marian is not None
        marian, src, n_new = self.marian, self.src, self.n_new
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


def _time(c: _Contenders, args: argparse.Namespace) -> dict[str, Any]:
    """Rows: each contender's times, medians, sentences/s and output length."""
    lengths: dict[str, int] = {}

    def recording(name: str, fn: Callable[[], Tensor]) -> Callable[[], None]:
        def call() -> None:
            # Generated tokens per sentence; HF's output starts with the decoder start token.
            lengths[name] = int(fn().size(1)) - int(name.startswith("hf_"))

        return call

    timed = {name: recording(name, fn) for name, fn in c.calls.items()}
    for name, fn in timed.items():  # warm-up, except the slow uncached runs
        if "uncached" not in name:
            fn()
    repeats_per = {n: args.uncached_repeats for n in c.calls if "uncached" in n}
    times = interleaved_times(timed, args.repeats, warmup=0, repeats_per=repeats_per)
    return {
        name: {
            "batch": c.batch_of[name],
            "median_s": median(t),
            "min_s": min(t),
            "times_s": t,
            "sentences_per_s": c.batch_of[name] / median(t),
            "output_length": lengths[name],
        }
        for name, t in times.items()
    }


def _goals(rows: dict[str, Any], beams: list[int], *, b_small: int, n_new: int, hf: bool) -> list:
    """Cached >= 3x uncached, and ours >= 2x Marian ``generate``, per beam size."""
    goals = []
    for beam in beams:
        cached = rows[f"ours_cached_k{beam}"]["sentences_per_s"]
        goals.append(
            goal(
                f"beam {beam}: cached >= 3x uncached at {n_new} output tokens (batch {b_small})",
                rows[f"ours_cached_k{beam}_b{b_small}"]["sentences_per_s"]
                / rows[f"ours_uncached_k{beam}_b{b_small}"]["sentences_per_s"],
                3.0,
            )
        )
        if hf:
            goals.append(
                goal(
                    f"beam {beam}: ours (cached) >= 2x HF MarianMTModel.generate",
                    cached / rows[f"hf_marian_k{beam}"]["sentences_per_s"],
                    2.0,
                )
            )
    return goals


def _settings(args: argparse.Namespace, c: _Contenders) -> dict[str, Any]:
    n_new, marian = args.new_tokens, c.marian
    settings = {
        "model": c.model.config.to_dict(),
        "parameters_ours": parameter_count(c.model),
        "parameters_hf": parameter_count(marian) if marian is not None else None,
        "batch": args.batch,
        "uncached_batch": c.small.size(0),
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
    }
    if marian is not None:
        import transformers

        settings["transformers"] = transformers.__version__
        settings["hf_attn_implementation"] = marian.config._attn_implementation
    return settings


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Sentences/s of greedy and beam search, cached and uncached, vs Marian ``generate``."""
    config = model_config(args, max_len=max(256, args.new_tokens + 2, args.src_len))
    model = Transformer(config).eval()
    model.generator.register_forward_hook(_suppress_eos_hook)
    marian = _marian(config)
    c = _Contenders(args, model, marian)
    rows = _time(c, args)
    goals = _goals(
        rows, args.beams, b_small=c.small.size(0), n_new=args.new_tokens, hf=marian is not None
    )
    result: dict[str, Any] = {
        "benchmark": "decode",
        "settings": _settings(args, c),
        "hf_available": marian is not None,
        "hf_note": None if marian is not None else "transformers is not installed: skipped",
        "rows": rows,
        "goals": goals,
        "environment": environment(),
    }
    if args.profile:
        result["profile"] = {
            name: top_ops(c.calls[name], calls=1)
            for name in c.calls
            if name.startswith(("ours_cached", "hf_")) and "_b" not in name
        }
    return result


def tables(result: dict[str, Any]) -> list[Table]:
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
