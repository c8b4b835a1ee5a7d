"""Dropout: same distribution and train/eval behaviour as nn.Dropout; the fused residual add."""

from __future__ import annotations

import pytest
import torch

from transformer_mt.model.dropout import Dropout


@pytest.mark.parametrize("p", [0.1, 0.3])
def test_drops_a_fraction_p_and_scales_the_rest(p: float) -> None:
    torch.manual_seed(0)
    x = torch.full((400, 500), 2.0)
    y = Dropout(p).train()(x)
    dropped = (y == 0).float().mean().item()
    assert dropped == pytest.approx(p, abs=0.005)  # 200k draws: std of the fraction ~0.001
    kept = y[y != 0]
    torch.testing.assert_close(kept, torch.full_like(kept, 2.0 / (1 - p)))
    assert y.mean().item() == pytest.approx(2.0, rel=0.01)  # the expectation is preserved


def test_eval_mode_and_p_zero_are_the_identity() -> None:
    x = torch.randn(8, 16)
    assert Dropout(0.5).eval()(x) is x
    assert Dropout(0.0).train()(x) is x
    residual = torch.randn(8, 16)
    torch.testing.assert_close(Dropout(0.5).eval().add(residual, x), residual + x)


def test_add_is_residual_plus_dropout_with_the_same_mask_in_the_gradient() -> None:
    torch.manual_seed(0)
    drop = Dropout(0.25).train()
    residual = torch.randn(64, 32, requires_grad=True)
    x = torch.randn(64, 32, requires_grad=True)
    out = drop.add(residual, x)
    dropped = out.detach() == residual.detach()  # where x's contribution was dropped
    assert 0.15 < dropped.float().mean().item() < 0.35
    out.sum().backward()
    assert residual.grad is not None and x.grad is not None
    torch.testing.assert_close(residual.grad, torch.ones_like(residual))
    # d out / d x is the scaled mask: 0 where dropped, 1/(1-p) where kept.
    expected = torch.where(dropped, 0.0, 1 / 0.75)
    torch.testing.assert_close(x.grad, expected)


def test_seeded_runs_draw_the_same_mask() -> None:
    x = torch.randn(32, 32)
    torch.manual_seed(3)
    a = Dropout(0.2).train()(x)
    torch.manual_seed(3)
    b = Dropout(0.2).train()(x)
    torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_neighbouring_decisions_are_independent(dtype: torch.dtype) -> None:
    """Pairs of neighbouring elements are kept together as often as independent draws would
    be (the kept fraction squared), in float32 and bfloat16 alike."""
    torch.manual_seed(0)
    p = 0.3
    kept = Dropout(p).train()(torch.ones(200_003, dtype=dtype)) != 0
    rate = kept.float().mean().item()
    assert rate == pytest.approx(1 - p, abs=0.004)  # std of the fraction ~0.001
    for offset in (1, 2, 3, 4):
        both = (kept[:-offset] & kept[offset:]).float().mean().item()
        # Independent: both / rate**2 = 1 (std ~0.003); one decision copied: 1 / rate.
        assert both / rate**2 == pytest.approx(1.0, abs=0.012)


def test_odd_shapes_and_empty_tensors() -> None:
    drop = Dropout(0.5).train()
    assert drop(torch.ones(3, 5, 7)).shape == (3, 5, 7)
    assert drop(torch.ones(0, 4)).shape == (0, 4)


def test_a_p_near_1_keeps_its_small_share_scaled() -> None:
    torch.manual_seed(0)
    p = 0.999
    y = Dropout(p).train()(torch.ones(400_000))
    kept = y[y != 0]
    assert kept.numel() / 400_000 == pytest.approx(1 - p, abs=2.5e-4)  # std ~5e-5
    torch.testing.assert_close(kept, torch.full_like(kept, 1 / (1 - p)))
