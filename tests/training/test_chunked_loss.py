"""The chunked output projection + loss equals the plain one: values and gradients."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from transformer_mt.training.config import TrainingConfig
from transformer_mt.training.loss import chunked_label_smoothed_loss, label_smoothed_loss

from conftest import FAST_TRAIN, compose_train


@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
@pytest.mark.parametrize("chunk", [1, 7, 10_000])
def test_equals_the_plain_loss_and_its_gradients(label_smoothing: float, chunk: int) -> None:
    torch.manual_seed(0)
    hidden = torch.randn(6, 11, 16, requires_grad=True)
    weight = torch.randn(53, 16, requires_grad=True)
    target = torch.randint(4, 53, (6, 11))
    target[:2, 7:] = 0  # padding

    plain = label_smoothed_loss(hidden @ weight.t(), target, 0, label_smoothing)
    chunked = chunked_label_smoothed_loss(
        hidden, weight, target, pad_id=0, label_smoothing=label_smoothing, chunk_tokens=chunk
    )
    for a, b in zip(plain, chunked):
        torch.testing.assert_close(a.float(), b.float(), rtol=1e-5, atol=1e-5)
    want = torch.autograd.grad(2.5 * plain[0], (hidden, weight))
    got = torch.autograd.grad(2.5 * chunked[0], (hidden, weight))
    for a, b in zip(want, got):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
def test_under_autocast_equals_the_plain_loss_and_runs_its_products_in_bf16(
    label_smoothing: float,
) -> None:
    """bf16-mixed: the chunked loss matches the plain one computed under the same autocast
    (products in bf16, softmax in float32), and its products really run in bf16: it lands
    nearer that plain loss than the float32 one."""
    torch.manual_seed(0)
    hidden = torch.randn(6, 11, 16, requires_grad=True)
    weight = torch.randn(53, 16, requires_grad=True)
    target = torch.randint(4, 53, (6, 11))
    target[:2, 7:] = 0
    with torch.autocast("cpu", dtype=torch.bfloat16):
        plain = label_smoothed_loss(
            torch.nn.functional.linear(hidden, weight), target, 0, label_smoothing
        )
        chunked = chunked_label_smoothed_loss(
            hidden, weight, target, pad_id=0, label_smoothing=label_smoothing, chunk_tokens=7
        )
    fp32 = label_smoothed_loss(hidden @ weight.t(), target, 0, label_smoothing)
    assert chunked[0].dtype == torch.float32 and chunked[0].requires_grad
    torch.testing.assert_close(chunked[0], plain[0], rtol=1e-5, atol=1e-5)
    off_fp32, off_plain = (float((chunked[0] - x[0]).detach().abs()) for x in (fp32, plain))
    assert off_fp32 > 10 * off_plain
    want = torch.autograd.grad(plain[0], (hidden, weight))
    got = torch.autograd.grad(chunked[0], (hidden, weight))
    assert got[0].dtype == hidden.dtype and got[1].dtype == weight.dtype
    for a, b in zip(want, got):
        torch.testing.assert_close(b, a, rtol=2e-2, atol=2e-3)


def test_a_training_run_gives_the_plain_runs_weights(tmp_path: Path) -> None:
    """Same seed, same batches: a few steps with the chunked loss end where the plain loss
    ends (up to float rounding of a different summation order)."""
    from transformer_mt.training.run import run

    weights = {}
    for name, extra in (("plain", []), ("chunked", ["module.loss_chunk_tokens=64"])):
        run_dir = tmp_path / name
        run(
            compose_train(
                run_dir, [*FAST_TRAIN, "trainer.max_steps=8", "test_after_fit=false", *extra]
            )
        )
        weights[name] = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)[
            "state_dict"
        ]
    for key, value in weights["plain"].items():
        if key.endswith("k_proj.bias"):
            # Its gradient is zero in exact arithmetic (a key bias adds the same score to every
            # key of a query, which softmax ignores), so Adam turns rounding noise into steps.
            continue
        torch.testing.assert_close(weights["chunked"][key], value, rtol=1e-4, atol=1e-5, msg=key)


def test_a_negative_chunk_is_one_line() -> None:
    with pytest.raises(ValueError, match=r"module.loss_chunk_tokens must be >= 0"):
        TrainingConfig(loss_chunk_tokens=-1)
