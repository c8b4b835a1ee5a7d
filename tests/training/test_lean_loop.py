"""The lean training loop: no host reads between log steps, deferred NaN checks, bf16 clipping."""

from __future__ import annotations

import csv
import math
import os
import sys
from collections.abc import Callable
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.loggers import CSVLogger
from torch.overrides import TorchFunctionMode
from torch.utils.data import DataLoader

from transformer_mt.errors import NonFiniteLossError
from transformer_mt.model.config import ModelConfig
from transformer_mt.training.config import TrainingConfig
from transformer_mt.training.module import TranslationModule

from conftest import PAD, random_batch

#: Tensor methods that copy a value to the host: on an accelerator each one waits for the device.
HOST_READS = {"item", "__bool__", "__int__", "__float__", "__index__", "tolist"}

MODEL = {
    "src_vocab_size": 40,
    "tgt_vocab_size": 40,
    "pad_id": PAD,
    "d_model": 16,
    "n_heads": 2,
    "d_ff": 32,
    "n_encoder_layers": 1,
    "n_decoder_layers": 1,
    "dropout": 0.0,
}


class HostReads(TorchFunctionMode):
    """Counts tensor-to-host reads made while it is active, outside the model itself.

    The model reads one flag per attention call on the CPU only (a cheap shortcut it skips on
    accelerators; see ``MultiHeadAttention.forward``), so its frames are left out here.
    """

    def __init__(self) -> None:
        super().__init__()
        self.reads: list[str] = []

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = getattr(func, "__name__", "")
        if name in HOST_READS:
            caller = sys._getframe(1).f_code.co_filename
            if f"transformer_mt{os.sep}model{os.sep}" not in caller:
                self.reads.append(name)
        return func(*args, **(kwargs or {}))


def _batches(n: int, poison_at: int | None = None) -> list[dict[str, torch.Tensor]]:
    torch.manual_seed(0)
    out = []
    for i in range(n):
        src, tgt = random_batch(batch=4, src_len=7, tgt_len=6)
        batch = {"src": src, "tgt": tgt}
        if i == poison_at:
            batch["poison"] = torch.ones(())
        out.append(batch)
    return out


class _Module(TranslationModule):
    """The real module; a batch carrying ``poison`` gets a NaN loss (as a diverged run would)."""

    def _loss(self, batch: dict[str, Any]) -> Any:
        loss, nll_sum, n_tokens = super()._loss(batch)
        if "poison" in batch:
            loss = loss * float("nan")
        return loss, nll_sum, n_tokens


def _module(**training: Any) -> _Module:
    return _Module(
        ModelConfig(**MODEL),
        optimizer=lambda p: torch.optim.AdamW(p, lr=1e-3, fused=True),
        training=TrainingConfig(warmup_steps=1, **training),
    )


def _trainer(steps: int, **kwargs: Any) -> pl.Trainer:
    values: dict[str, Any] = dict(
        accelerator="cpu",
        max_steps=steps,
        log_every_n_steps=3,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
    )
    values.update(kwargs)
    return pl.Trainer(**values)


def _loader(batches: list[dict[str, torch.Tensor]]) -> DataLoader:
    return DataLoader(batches, batch_size=None)


def _count_reads(module: TranslationModule) -> list[list[str]]:
    """Wrap ``training_step``: the host reads of each call, in step order."""
    per_step: list[list[str]] = []
    step: Callable[..., Any] = module.training_step

    def counted(*args: Any, **kwargs: Any) -> Any:
        with HostReads() as mode:
            out = step(*args, **kwargs)
        per_step.append(mode.reads)
        return out

    module.training_step = counted  # type: ignore[method-assign]
    return per_step


def _as_accelerator(module: TranslationModule, monkeypatch: pytest.MonkeyPatch) -> None:
    """Take the accelerator path on the CPU: finiteness checked at log steps only."""
    monkeypatch.setattr(
        "transformer_mt.training.module.check_at_once", lambda device, nonfinite_loss: False
    )


def test_accelerator_step_reads_nothing_from_the_device_between_log_steps(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    module = _module()
    _as_accelerator(module, monkeypatch)
    per_step = _count_reads(module)
    _trainer(7).fit(module, _loader(_batches(7)))
    assert len(per_step) == 7
    log_steps = {3, 6}  # log_every_n_steps=3, counted from 1
    for number, reads in enumerate(per_step, start=1):
        if number in log_steps:
            assert reads, f"step {number} is a log step: the NaN flag is read there"
        else:
            assert reads == [], f"step {number} read {reads} from the device"


def test_cpu_step_checks_the_loss_at_once_and_nothing_else(monkeypatch: pytest.MonkeyPatch) -> None:
    module = _module()
    per_step = _count_reads(module)
    _trainer(5).fit(module, _loader(_batches(5)))
    # One scalar read per step (free on a CPU): the finiteness test of the loss.
    assert [reads for i, reads in enumerate(per_step, start=1) if i != 3] == [["__bool__"]] * 4


def test_deferred_nan_check_stops_at_the_next_log_step(monkeypatch: pytest.MonkeyPatch) -> None:
    module = _module()
    _as_accelerator(module, monkeypatch)
    trainer = _trainer(9)
    with pytest.raises(NonFiniteLossError, match=r"non-finite in the 3 steps up to 5"):
        trainer.fit(module, _loader(_batches(9, poison_at=3)))  # the 4th step
    assert trainer.global_step == 5  # noticed at step 6, the next log step


def test_cpu_nan_check_stops_at_the_bad_step() -> None:
    module = _module()
    trainer = _trainer(9)
    with pytest.raises(NonFiniteLossError, match=r"became nan at step 3"):
        trainer.fit(module, _loader(_batches(9, poison_at=3)))


def test_logged_perplexity_is_token_weighted_over_the_window(tmp_path: Any) -> None:
    module = _module()
    seen: list[tuple[float, int]] = []  # (nll sum, tokens) of every training step
    loss_fn = module._loss

    def recording(batch: dict[str, Any]) -> Any:
        out = loss_fn(batch)
        seen.append((float(out[1]), int(out[2])))
        return out

    module._loss = recording  # type: ignore[method-assign]
    _trainer(6, logger=CSVLogger(tmp_path, name="", version="")).fit(module, _loader(_batches(6)))
    rows = [r for r in csv.DictReader((tmp_path / "metrics.csv").open()) if r.get("train/ppl")]
    assert [int(r["step"]) for r in rows] == [2, 5]  # log steps 3 and 6 (Lightning counts from 0)
    for row, window in zip(rows, (seen[0:3], seen[3:6])):
        expected = math.exp(sum(n for n, _ in window) / sum(t for _, t in window))
        assert float(row["train/ppl"]) == pytest.approx(expected, rel=1e-5)
        assert float(row["train/tokens_per_sec"]) > 0
        assert float(row["train/lr"]) > 0


class _GradNorm(pl.Callback):
    def __init__(self) -> None:
        self.norms: list[float] = []

    def on_train_batch_end(self, trainer: Any, module: Any, *args: Any) -> None:
        grads = [p.grad for p in module.parameters() if p.grad is not None]
        self.norms.append(float(torch.linalg.vector_norm(torch.stack([g.norm() for g in grads]))))


def test_bf16_mixed_clips_gradients_with_a_fused_optimizer() -> None:
    # Lightning's mixed-precision plugin refuses clipping with fused AdamW (a GradScaler
    # concern); bf16 has no scaler, so the module clips itself. Before: RuntimeError.
    norms = _GradNorm()
    trainer = _trainer(3, precision="bf16-mixed", gradient_clip_val=1e-3, callbacks=[norms])
    trainer.fit(_module(), _loader(_batches(3)))
    assert len(norms.norms) == 3
    assert all(0 < n <= 1e-3 * 1.01 for n in norms.norms), norms.norms
