"""``trainer.precision=auto``: pick the training precision this machine runs fastest.

On a CPU with bf16 units a short calibration times whole training steps of the actual model
in fp32 and under bf16 autocast, since casts and the work outside the matrix products can eat
bf16's gain on a small model (docs/training.md). Rules:

* CUDA with bf16 (Ampere or newer): ``bf16-mixed`` (tensor cores; no loss scaling needed).
* CUDA without bf16: ``32-true`` (``16-mixed`` needs a GradScaler; ask for it explicitly).
* CPU without bf16 units: ``32-true`` (bf16 is emulated there, many times slower).
* CPU with bf16 units: the calibration decides between ``bf16-mixed`` and ``32-true``.

``bf16-true`` (bf16 weights and optimizer state) is never chosen automatically: it changes
the training math (updates smaller than bf16's resolution are lost), not just its speed.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import statistics
import time
from dataclasses import dataclass

import torch
from torch import nn

from transformer_mt.provenance import cpu_units

log = logging.getLogger(__name__)

#: bf16 must beat fp32 by this factor in the median of the paired rounds to be chosen: a busy
#: machine slows both halves of a round, and one odd round does not decide.
MIN_SPEEDUP = 1.25

#: Paired rounds of the calibration (after one warm-up round).
ROUNDS = 7

CPU_BF16_FLAGS = ("amx_bf16", "avx512_bf16")


@dataclass(frozen=True)
class Choice:
    """A resolved precision and the reason, for the start-up log line."""

    precision: str
    reason: str


def cpu_bf16_units(flags: set[str] | None = None) -> list[str]:
    """The bf16 instruction sets this CPU has (``amx_bf16``, ``avx512_bf16``), best first."""
    flags = set(cpu_units()) if flags is None else flags
    return [f for f in CPU_BF16_FLAGS if f in flags]


def _uses_cuda(accelerator: str | None) -> bool:
    if accelerator in ("gpu", "cuda"):
        return True
    return accelerator in (None, "auto") and torch.cuda.is_available()


def resolve_precision(
    requested: str | int | None,
    accelerator: str | None,
    model: nn.Module | None = None,
    *,
    flags: set[str] | None = None,
    calibrate_steps: int = ROUNDS,
    batch_tokens: int = 2048,
) -> Choice:
    """The Lightning precision to train with; ``requested`` other than ``auto`` is kept.

    Args:
        requested: ``trainer.precision`` as configured (``auto``, ``32-true``, ...).
        accelerator: ``trainer.accelerator`` (``cpu``, ``gpu``, ``auto``, ...).
        model: the model to calibrate with on a CPU that has bf16 units (a copy is timed).
            Without it such a CPU gets fp32.
        flags: CPU flags (tests); read from ``/proc/cpuinfo`` when None.
        calibrate_steps: timed training steps per precision.
        batch_tokens: about the tokens of the calibration batch (``data.max_tokens``).
    """
    if requested is None:
        return Choice("32-true", "Lightning's default (trainer.precision not set)")
    if str(requested) != "auto":
        return Choice(str(requested), "set in the config")
    if _uses_cuda(accelerator):
        name = torch.cuda.get_device_name(0)
        if torch.cuda.is_bf16_supported():
            return Choice("bf16-mixed", f"{name} has bf16 tensor cores")
        return Choice("32-true", f"{name} has no bf16 (16-mixed is available on request)")
    units = cpu_bf16_units(flags)
    if not units:
        return Choice(
            "32-true",
            f"this CPU has no bf16 units ({'/'.join(CPU_BF16_FLAGS)} absent): bf16 would be "
            "emulated and several times slower",
        )
    if model is None:
        return Choice("32-true", f"CPU has {', '.join(units)} but no model to calibrate with")
    rounds = calibrate(model, calibrate_steps, batch_tokens=batch_tokens)
    ratios = [fp32 / bf16 for fp32, bf16 in rounds]
    speedup = statistics.median(ratios)
    measured = (
        f"{', '.join(units)}; calibration: bf16-mixed {speedup:.2f}x fp32 training-step "
        f"speed (median of {len(ratios)} paired rounds, {min(ratios):.2f}x-{max(ratios):.2f}x)"
    )
    if speedup >= MIN_SPEEDUP:
        return Choice("bf16-mixed", measured)
    return Choice("32-true", f"{measured}: not a clear gain (needs >= {MIN_SPEEDUP:.2f}x)")


def calibration_batch(
    model: nn.Module, batch: int | None = None, length: int = 24, *, tokens: int = 1152
) -> tuple:
    """A synthetic ``(src, tgt_in, tgt_out)`` of typical sentence-batch shape for ``model``:
    sentences of ``length`` tokens, ``batch`` of them (default: as many as ``tokens``
    holds)."""
    batch = batch or max(1, tokens // length)
    config = model.config
    gen = torch.Generator().manual_seed(0)
    vocab = min(config.src_vocab_size, config.tgt_vocab_size)
    low = 4 if vocab > 8 else 0  # skip the special ids when there is room
    src = torch.randint(low, vocab, (batch, length), generator=gen)
    tgt = torch.randint(low, vocab, (batch, length + 1), generator=gen)
    return src, tgt[:, :-1], tgt[:, 1:]


def calibrate(
    model: nn.Module, steps: int = ROUNDS, *, batch_tokens: int = 1152
) -> list[tuple[float, float]]:
    """Seconds of one training step of a copy of ``model``, per round: (fp32, bf16).

    A step is forward, loss, backward, clipping and a fused AdamW step on about
    ``batch_tokens`` tokens. The precisions alternate (order swapped between rounds) so a busy
    machine slows both alike; the global RNG and ``model`` are left untouched.
    """
    from transformer_mt.training.loss import label_smoothed_loss

    probe = copy.deepcopy(model).train()
    src, tgt_in, tgt_out = calibration_batch(probe, tokens=batch_tokens)
    optimizer = torch.optim.AdamW(probe.parameters(), lr=1e-9, fused=True)
    times: dict[str, list[float]] = {"fp32": [], "bf16": []}
    contexts = {
        "fp32": contextlib.nullcontext,
        "bf16": lambda: torch.autocast("cpu", dtype=torch.bfloat16),
    }
    with torch.random.fork_rng(devices=[]):
        for i in range(steps + 1):  # the first round warms up (allocations, kernel choice)
            for name in ("fp32", "bf16") if i % 2 == 0 else ("bf16", "fp32"):
                start = time.perf_counter()
                with contexts[name]():
                    logits = probe(src, tgt_in)
                loss, _, _ = label_smoothed_loss(logits, tgt_out, probe.pad_id, 0.1)
                loss.backward()
                nn.utils.clip_grad_norm_(probe.parameters(), 1.0)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                if i > 0:
                    times[name].append(time.perf_counter() - start)
    return list(zip(times["fp32"], times["bf16"]))
