"""trainer.precision=auto: detection, the calibration rule, and what the start-up logs."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from transformer_mt.inference.engine import TorchEngine
from transformer_mt.model.transformer import Transformer
from transformer_mt.provenance import cpu_units
from transformer_mt.training import precision
from transformer_mt.training.module import TranslationModule
from transformer_mt.training.precision import (
    calibrate,
    cpu_bf16_units,
    resolve_precision,
)

from conftest import (
    FAST_TRAIN,
    best_checkpoint,
    compose_train,
    evaluate,
    tiny_config,
    trainer_test_metrics,
)


def test_cpu_flags_are_read_from_cpuinfo(tmp_path: Path) -> None:
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu sse avx512f avx512_bf16 amx_tile amx_bf16\n")
    flags = set(cpu_units(info))
    assert {"avx512_bf16", "amx_bf16"} <= flags
    assert cpu_bf16_units(flags) == ["amx_bf16", "avx512_bf16"]  # best first
    assert cpu_bf16_units({"avx2", "avx512f"}) == []
    assert cpu_units(tmp_path / "missing") == []


@pytest.mark.parametrize("value", ["32-true", "bf16-mixed", "bf16-true", "16-mixed"])
def test_an_explicit_precision_is_kept(value: str) -> None:
    assert resolve_precision(value, "cpu").precision == value


def test_unset_precision_is_lightnings_default() -> None:
    assert resolve_precision(None, "cpu").precision == "32-true"


def test_auto_on_a_cpu_without_bf16_units_is_fp32_without_calibrating(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(precision, "calibrate", pytest.fail)  # must not be called
    choice = resolve_precision("auto", "cpu", Transformer(tiny_config()), flags={"avx2"})
    assert choice.precision == "32-true"
    assert "no bf16 units" in choice.reason


@pytest.mark.parametrize(
    ("bf16_rounds", "expected"),
    [
        ([0.5, 0.5, 0.6, 0.5, 0.5], "bf16-mixed"),  # clearly faster every round
        ([0.95, 0.9, 1.0, 0.95, 0.9], "32-true"),  # a few percent: not worth it
        ([1.4, 1.3, 1.4, 1.5, 1.4], "32-true"),  # slower
        # Noise of a busy machine: one round where fp32 won does not flip a clear median.
        ([0.5, 0.6, 1.2, 0.55, 0.5], "bf16-mixed"),
        # ... nor does one round far ahead make a tie a gain.
        ([1.0, 0.3, 0.98, 1.02, 1.0], "32-true"),
    ],
)
def test_auto_with_bf16_units_follows_the_calibration(
    monkeypatch: pytest.MonkeyPatch, bf16_rounds: list[float], expected: str
) -> None:
    rounds = [(1.0, b) for b in bf16_rounds]
    monkeypatch.setattr(precision, "calibrate", lambda model, steps, batch_tokens: rounds)
    choice = resolve_precision("auto", "cpu", Transformer(tiny_config()), flags={"amx_bf16"})
    assert choice.precision == expected
    median = sorted(1.0 / b for b in bf16_rounds)[2]
    assert f"{median:.2f}x" in choice.reason and "amx_bf16" in choice.reason


def test_calibration_leaves_model_and_random_stream_untouched() -> None:
    model = Transformer(tiny_config(dropout=0.1))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    torch.manual_seed(123)
    expected_next = torch.rand(3)
    torch.manual_seed(123)
    ((fp32_s, bf16_s),) = calibrate(model, steps=1)
    assert fp32_s > 0 and bf16_s > 0
    torch.testing.assert_close(torch.rand(3), expected_next)  # dropout draws did not leak
    for key, value in model.state_dict().items():
        torch.testing.assert_close(value, before[key])
    assert all(p.grad is None for p in model.parameters())


def test_bf16_mixed_scores_with_the_search_evaluate_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under bf16-mixed the evaluation loss keeps autocast, the search that makes val/bleu and
    test/bleu runs without it, as evaluate.py's does: the two commands report one score."""
    from transformer_mt.training.run import run

    autocast: dict[str, list[bool]] = {"loss": [], "search": []}
    loss, decode = TranslationModule._loss, TorchEngine.decode_batch

    def spy_loss(self, batch):
        if not self.training:
            autocast["loss"].append(torch.is_autocast_enabled("cpu"))
        return loss(self, batch)

    def spy_decode(self, *args, **kwargs):
        autocast["search"].append(torch.is_autocast_enabled("cpu"))
        return decode(self, *args, **kwargs)

    monkeypatch.setattr(TranslationModule, "_loss", spy_loss)
    monkeypatch.setattr(TorchEngine, "decode_batch", spy_decode)
    overrides = ["callbacks=default", "callbacks.progress_bar=null", "trainer.precision=bf16-mixed"]
    run(compose_train(tmp_path, [*FAST_TRAIN, *overrides]))
    monkeypatch.undo()
    assert autocast["loss"] and all(autocast["loss"])  # the run did evaluate under bf16
    assert autocast["search"] and not any(autocast["search"])
    results = evaluate(tmp_path / "evaluate", f"ckpt_path={best_checkpoint(tmp_path)}")
    expected = trainer_test_metrics(tmp_path)
    assert results["metrics"]["bleu"] == pytest.approx(expected["test/bleu"], abs=0.01)
    assert results["metrics"]["chrf"] == pytest.approx(expected["test/chrf"], abs=0.01)
