"""Tests that need CUDA (``pytest -m gpu``; ``scripts/gpu_check.sh`` runs them).

Without a CUDA device every test here is skipped with the reason; they run on the CPU-only
default suite as skips, so they at least import and collect.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from transformer_mt.training.precision import resolve_precision
from transformer_mt.training.step import is_log_step

from test_lean_loop import _batches, _loader, _module, _trainer

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available(),
        reason="needs a CUDA device (torch.cuda.is_available() is False)",
    ),
]


def test_auto_precision_is_bf16_mixed_on_a_bf16_gpu() -> None:
    choice = resolve_precision("auto", "gpu")
    expected = "bf16-mixed" if torch.cuda.is_bf16_supported() else "32-true"
    assert choice.precision == expected
    assert torch.cuda.get_device_name(0) in choice.reason


def test_training_steps_do_not_synchronize_with_the_gpu() -> None:
    # torch raises on any device->host synchronisation while the debug mode is "error"; the
    # training step runs under it on every step that is not a log step.
    module = _module()
    step = module.training_step
    checked: list[int] = []

    def strict(*args: Any, **kwargs: Any) -> Any:
        if is_log_step(module._trainer):
            return step(*args, **kwargs)
        torch.cuda.set_sync_debug_mode("error")
        try:
            return step(*args, **kwargs)
        finally:
            torch.cuda.set_sync_debug_mode("default")
            checked.append(module.global_step)

    module.training_step = strict  # type: ignore[method-assign]
    _trainer(7, accelerator="gpu", devices=1, precision="bf16-mixed").fit(
        module, _loader(_batches(7))
    )
    assert len(checked) == 5  # steps 1, 2, 4, 5, 7 (3 and 6 are log steps)


def test_bf16_mixed_fit_on_the_gpu_learns_with_clipping() -> None:
    module = _module()
    trainer = _trainer(
        30, accelerator="gpu", devices=1, precision="bf16-mixed", gradient_clip_val=1.0
    )
    batches = _batches(1) * 30  # one batch, repeated: the loss must fall
    first = float(module._loss({k: v for k, v in batches[0].items()})[0])
    trainer.fit(module, _loader(batches))
    module.cpu()
    last = float(module._loss(batches[0])[0])
    assert last < first * 0.8
