"""The lean parts of the training step: no host sync between log steps, bf16 clipping.

Reading a tensor on the host stalls a GPU every step, so metrics are summed on the device
(:class:`StepWindow`) and read once per ``log_every_n_steps``, the NaN check with them.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from torch import Tensor

from transformer_mt.errors import NonFiniteLossError


def is_log_step(trainer: Any) -> bool:
    """Whether Lightning writes logs after this training step (``log_every_n_steps``)."""
    if trainer is None:
        return True
    return bool(trainer.fast_dev_run) or trainer._logger_connector.should_update_logs


def check_at_once(device: torch.device, nonfinite_loss: str) -> bool:
    """Whether a step must know at once that its loss is finite: on the CPU a read costs
    nothing, and ``skip`` decides before the optimizer step; else it waits for a log step."""
    return device.type == "cpu" or nonfinite_loss == "skip"


def nonfinite_error(what: str) -> NonFiniteLossError:
    return NonFiniteLossError(
        f"training loss became {what}; likely causes: "
        "learning rate too high (lower optimizer.lr or raise warmup_steps), fp16 "
        "overflow (use bf16-mixed or 32-true), or corrupt data. The last checkpoint is "
        "intact; set module.nonfinite_loss=skip to skip such batches instead"
    )


class StepWindow:
    """Device-side sums over the training steps since the last log step."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.sums: dict[str, Tensor] = {}
        self.steps = 0
        self.start = time.perf_counter()

    def add(self, nll_sum: Tensor, n_tokens: Tensor, finite: Tensor | None) -> None:
        """One step's values; ``finite`` (a device bool) when its check was deferred."""
        values = {"nll": nll_sum.detach().float(), "tokens": n_tokens.detach()}
        if finite is not None:
            values["bad"] = (~finite).int()
        for key, value in values.items():
            self.sums[key] = self.sums[key] + value if key in self.sums else value.clone()
        self.steps += 1

    def take(self, global_step: int) -> dict[str, Tensor]:
        """The window's metrics (tensors; raises on a deferred non-finite loss); resets it."""
        sums, steps, elapsed = self.sums, self.steps, time.perf_counter() - self.start
        self.reset()
        if "bad" in sums and bool(sums["bad"]):  # the one host read of a deferred check
            raise nonfinite_error(f"non-finite in the {steps} steps up to {global_step}")
        tokens = sums["tokens"].clamp(min=1)
        # Throughput over the window's wall clock, data loading and logging included.
        metrics = {"train/ppl": torch.exp((sums["nll"] / tokens).clamp(max=50.0))}
        if elapsed > 0:
            metrics["train/tokens_per_sec"] = tokens.float() / elapsed
        return metrics


def clip_without_scaler(
    module: torch.nn.Module, plugin: Any, clip_val: float | None, algorithm: Any
) -> bool:
    """Clip gradients here when Lightning's plugin would refuse to; True when done.

    Lightning refuses with a fused optimizer, a concern of fp16's GradScaler only; bf16-mixed
    has no scaler, so its gradients clip as fp32's do.
    """
    if not clip_val or getattr(plugin, "scaler", "absent") is not None:
        return False
    if algorithm == "value":
        torch.nn.utils.clip_grad_value_(module.parameters(), clip_val)
    else:
        torch.nn.utils.clip_grad_norm_(module.parameters(), clip_val)
    return True
