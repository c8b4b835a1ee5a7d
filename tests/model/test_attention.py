"""Multi-head attention: the paper's math, the fused path and torch's reference agree.

Also the contract: self- vs cross-attention by the ``memory`` argument, one return type, boolean
masks, and attention weights through ``record_attention_weights``.
"""

from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn

from transformer_mt.model.attention import (
    MultiHeadAttention,
    causal_mask,
    padding_mask,
    record_attention_weights,
    scaled_dot_product_attention,
)
from transformer_mt.model.config import AttentionConfig, ModelConfig
from transformer_mt.model.kv_cache import KVCache


def _mha(
    d_model: int = 16,
    n_heads: int = 4,
    *,
    d_k: int | None = None,
    d_v: int | None = None,
    dropout: float = 0.0,
    fused: bool = True,
) -> MultiHeadAttention:
    """An attention layer configured the way the model configures it (``ModelConfig.attention``)."""
    config = ModelConfig(
        src_vocab_size=8,
        tgt_vocab_size=8,
        d_model=d_model,
        n_heads=n_heads,
        d_k=d_k,
        d_v=d_v,
        attention_dropout=dropout,
        fused_attention=fused,
    )
    return MultiHeadAttention(config.attention)


def _copy_into_torch_mha(ours: MultiHeadAttention) -> nn.MultiheadAttention:
    ref = nn.MultiheadAttention(ours.d_model, ours.n_heads, batch_first=True)
    with torch.no_grad():
        ref.in_proj_weight.copy_(
            torch.cat([ours.q_proj.weight, ours.k_proj.weight, ours.v_proj.weight])
        )
        ref.in_proj_bias.copy_(torch.cat([ours.q_proj.bias, ours.k_proj.bias, ours.v_proj.bias]))
        ref.out_proj.weight.copy_(ours.out_proj.weight)
        ref.out_proj.bias.copy_(ours.out_proj.bias)
    return ref.eval()


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("masking", ["none", "padding", "causal"])
def test_equals_torch_multihead_attention(fused: bool, masking: str) -> None:
    B, T, d_model, H = 3, 9, 32, 4
    ours = _mha(d_model, H, fused=fused).eval()
    ref = _copy_into_torch_mha(ours)
    x = torch.randn(B, T, d_model)
    tokens = torch.randint(1, 10, (B, T))
    tokens[0, 6:] = 0
    kwargs, ref_kwargs = {}, {}
    if masking == "padding":
        kwargs["mask"] = padding_mask(tokens, pad_id=0)
        ref_kwargs["key_padding_mask"] = tokens == 0  # torch: True = ignore
    elif masking == "causal":
        kwargs["mask"] = causal_mask(T)
        ref_kwargs["attn_mask"] = ~causal_mask(T)[0, 0]  # torch: True = not allowed
    out = ours(x, **kwargs)
    expected, _ = ref(x, x, x, need_weights=False, **ref_kwargs)
    assert (out - expected).abs().max().item() <= 1e-5
    # Cross-attention against the same torch module with a different key/value input.
    memory = torch.randn(B, 5, d_model)
    expected_cross, _ = ref(x, memory, memory, need_weights=False)
    assert (ours(x, memory) - expected_cross).abs().max().item() <= 1e-5


def test_is_causal_flag_equals_causal_mask() -> None:
    mha = _mha(32, 4).eval()
    x = torch.randn(2, 7, 32)
    torch.testing.assert_close(
        mha(x, is_causal=True), mha(x, mask=causal_mask(7)), atol=1e-6, rtol=1e-5
    )


def test_self_or_cross_is_the_memory_argument_not_object_identity() -> None:
    mha = _mha(16, 4).eval()
    x = torch.randn(2, 5, 16)
    self_attn = mha(x)
    # Cross-attention to an equal tensor (the same object or a copy) is the same math.
    torch.testing.assert_close(mha(x, x), self_attn, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(mha(x, x.clone()), self_attn, atol=1e-6, rtol=1e-5)
    # Keys and values come from memory: another memory, another output, with memory's length.
    assert not torch.allclose(mha(x, torch.randn(2, 5, 16)), self_attn)
    assert mha(x, torch.randn(2, 9, 16)).shape == (2, 5, 16)


def test_causal_cross_attention_is_refused() -> None:
    mha = _mha(16, 4)
    x = torch.randn(2, 5, 16)
    with pytest.raises(ValueError, match="is_causal is for self-attention"):
        mha(x, torch.randn(2, 5, 16), is_causal=True)


@pytest.mark.parametrize("mask_shape", ["padding", "causal", "per_query"])
def test_explicit_equals_fused(mask_shape: str) -> None:
    B, T, S, d_model, H = 2, 5, 8, 24, 3
    fused = _mha(d_model, H, fused=True).eval()
    explicit = _mha(d_model, H, fused=False).eval()
    explicit.load_state_dict(fused.state_dict())
    x, memory = torch.randn(B, T, d_model), torch.randn(B, S, d_model)
    if mask_shape == "padding":
        tokens = torch.randint(1, 9, (B, S))
        tokens[1, 5:] = 0
        mask = padding_mask(tokens, 0)  # (B, 1, 1, S)
    elif mask_shape == "causal":
        mask, memory = causal_mask(T), None  # (1, 1, T, T), self-attention
    else:
        mask = torch.rand(B, T, S) > 0.3  # (B, T, S)
        mask[:, :, 0] = True
    torch.testing.assert_close(
        fused(x, memory, mask=mask), explicit(x, memory, mask=mask), atol=1e-5, rtol=1e-5
    )


@pytest.mark.parametrize("half", [False, True])
def test_bf16_on_cpu_runs_the_explicit_math(monkeypatch: pytest.MonkeyPatch, half: bool) -> None:
    # The CPU flash kernel's bf16 backward is many times slower than its fp32 one; under bf16
    # autocast with autograd on, the paper's math runs instead, with the same result up to
    # bf16's precision.
    import transformer_mt.model.attention as attention

    mha = _mha(32, 4, fused=True).train()
    calls: list[torch.dtype] = []
    sdpa = attention.F.scaled_dot_product_attention

    def counting(q: Tensor, *args: object, **kwargs: object) -> Tensor:
        calls.append(q.dtype)
        return sdpa(q, *args, **kwargs)

    monkeypatch.setattr(attention.F, "scaled_dot_product_attention", counting)
    x = torch.randn(3, 12, 32)
    reference = mha(x, is_causal=True).detach()
    assert calls == [torch.float32]
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=half):
        out = mha(x, is_causal=True)
    out.float().sum().backward()
    assert calls == ([torch.float32] if half else [torch.float32, torch.float32])
    assert out.dtype == (torch.bfloat16 if half else torch.float32)
    torch.testing.assert_close(out.float(), reference, atol=5e-2, rtol=5e-2)
    # Without a backward to come (inference) the fused kernel's bf16 forward serves.
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=half):
        mha(x, is_causal=True)
    assert calls[-1] == (torch.bfloat16 if half else torch.float32)


def test_d_k_differs_from_d_v() -> None:
    mha = _mha(20, 3, d_k=5, d_v=7)
    assert mha.q_proj.weight.shape == (15, 20)  # d_model -> h * d_k
    assert mha.k_proj.weight.shape == (15, 20)
    assert mha.v_proj.weight.shape == (21, 20)  # d_model -> h * d_v
    assert mha.out_proj.weight.shape == (20, 21)  # h * d_v -> d_model
    x = torch.randn(2, 4, 20)
    out = mha(x)
    assert out.shape == (2, 4, 20)
    assert mha.compute_weights(x).shape == (2, 3, 4, 4)
    mha.fused = False
    torch.testing.assert_close(mha(x), out, atol=1e-5, rtol=1e-5)


def test_projection_is_per_head_not_shared() -> None:
    # Each head gets its own d_k columns: d_model -> h * d_k, not d_model -> d_k.
    mha = _mha(64, 8)
    assert mha.d_k == 8
    assert mha.q_proj.out_features == 8 * 8


def test_attention_config_from_model_config_resolves_head_sizes() -> None:
    config = ModelConfig(src_vocab_size=8, tgt_vocab_size=8, d_model=30, n_heads=3)
    assert config.attention == AttentionConfig(d_model=30, n_heads=3, d_k=10, d_v=10)
    explicit = ModelConfig(
        src_vocab_size=8, tgt_vocab_size=8, d_model=30, n_heads=4, d_k=8, d_v=6
    ).attention
    assert (explicit.d_k, explicit.d_v) == (8, 6)  # 30 % 4 != 0 is fine with explicit sizes


def test_fully_masked_row_is_zero_not_nan() -> None:
    q = torch.randn(1, 2, 3, 4, requires_grad=True)
    k, v = torch.randn(1, 2, 5, 4), torch.randn(1, 2, 5, 4)
    mask = torch.ones(1, 1, 3, 5, dtype=torch.bool)
    mask[0, 0, 1] = False  # query 1 may attend to nothing
    out, weights = scaled_dot_product_attention(q, k, v, mask)
    assert torch.isfinite(out).all() and torch.isfinite(weights).all()
    assert out[0, :, 1].abs().max() == 0
    out.sum().backward()
    assert torch.isfinite(q.grad).all()
    for fused in (True, False):
        mha = _mha(8, 2, fused=fused).eval()
        x = torch.randn(2, 3, 8)
        tokens = torch.tensor([[5, 6, 7], [0, 0, 0]])  # second row is all padding
        y = mha(x, mask=padding_mask(tokens, 0))
        assert torch.isfinite(y).all()


def test_weights_sum_to_one_and_respect_mask() -> None:
    q, k, v = torch.randn(2, 2, 4, 8), torch.randn(2, 2, 6, 8), torch.randn(2, 2, 6, 8)
    tokens = torch.tensor([[1, 2, 3, 4, 5, 6], [1, 2, 3, 0, 0, 0]])
    _, w = scaled_dot_product_attention(q, k, v, padding_mask(tokens, 0))
    torch.testing.assert_close(w.sum(-1), torch.ones(2, 2, 4))
    assert w[1, :, :, 3:].abs().max() == 0


def test_scaling_is_one_over_sqrt_d_k() -> None:
    q = torch.ones(1, 1, 1, 16)
    k = torch.stack([torch.ones(16), torch.zeros(16)])[None, None]  # (1, 1, 2, 16)
    v = torch.eye(2)[None, None]
    _, w = scaled_dot_product_attention(q, k, v)
    # scores are 16 / sqrt(16) = 4 and 0
    expected = torch.softmax(torch.tensor([4.0, 0.0]), dim=0)
    torch.testing.assert_close(w[0, 0, 0], expected)


def test_attention_dropout_only_in_training() -> None:
    mha = _mha(16, 2, dropout=0.5)
    x = torch.randn(2, 6, 16)
    mha.eval()
    torch.testing.assert_close(mha(x), mha(x))
    mha.train()
    assert not torch.allclose(mha(x), mha(x))


def test_attention_dropout_in_training_keeps_causality() -> None:
    # With attention dropout on CPU the explicit path runs; the future must stay invisible.
    mha = _mha(16, 2, dropout=0.3).train()
    x = torch.randn(2, 6, 16)
    y = x.clone()
    y[:, 3:] = torch.randn(2, 3, 16)  # change only positions 3..5
    torch.manual_seed(1)
    a = mha(x, is_causal=True)
    torch.manual_seed(1)  # the same dropout masks for both calls
    b = mha(y, is_causal=True)
    torch.testing.assert_close(a[:, :3], b[:, :3])
    assert not torch.allclose(a[:, 3:], b[:, 3:])


def test_boolean_mask_required() -> None:
    mha = _mha(8, 2)
    x = torch.randn(1, 3, 8)
    with pytest.raises(ValueError, match="boolean"):
        mha(x, mask=torch.ones(1, 1, 1, 3))
    with pytest.raises(ValueError, match=r"3 or 4 dims .* got shape \(3,\)"):
        mha(x, mask=torch.ones(3, dtype=torch.bool))


# ------------------------------------------------------------------------------ weights


def _heads_output(mha: MultiHeadAttention, weights: Tensor, values_from: Tensor) -> Tensor:
    """out_proj(Concat_h(weights_h V_h)): the layer's output rebuilt from given weights."""
    B, L, _ = values_from.shape
    v = mha.v_proj(values_from).view(B, L, mha.n_heads, mha.d_v).transpose(1, 2)  # (B,H,L,d_v)
    heads = weights @ v  # (B, H, T, d_v)
    return mha.out_proj(heads.transpose(1, 2).reshape(B, -1, mha.n_heads * mha.d_v))


@pytest.mark.parametrize("fused", [True, False])
def test_recorded_weights_are_the_ones_forward_applies(fused: bool) -> None:
    mha = _mha(16, 4, fused=fused).eval()
    x, memory = torch.randn(2, 5, 16), torch.randn(2, 7, 16)
    tokens = torch.randint(1, 9, (2, 7))
    tokens[1, 4:] = 0
    src_mask = padding_mask(tokens, 0)
    with record_attention_weights(mha) as records:
        out_self = mha(x, is_causal=True)
        out_cross = mha(x, memory, mask=src_mask)
    w_self, w_cross = records[""]  # one entry per call, in call order; "" = the root module
    assert w_self.shape == (2, 4, 5, 5) and w_cross.shape == (2, 4, 5, 7)
    torch.testing.assert_close(_heads_output(mha, w_self, x), out_self, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(_heads_output(mha, w_cross, memory), out_cross, atol=1e-5, rtol=1e-5)
    assert float(w_self.triu(1).abs().sum()) == 0.0  # causal
    assert float(w_cross[1, :, :, 4:].abs().sum()) == 0.0  # padding
    torch.testing.assert_close(w_cross.sum(-1), torch.ones(2, 4, 5))


def test_recording_changes_nothing_and_ends_with_the_block() -> None:
    mha = _mha(16, 4, dropout=0.2).train()
    x = torch.randn(2, 5, 16)
    torch.manual_seed(3)
    plain = mha(x, is_causal=True)
    torch.manual_seed(3)
    with record_attention_weights(mha) as records:
        recorded = mha(x, is_causal=True)
    torch.testing.assert_close(recorded, plain, rtol=0, atol=0)  # same path, same random stream
    assert not records[""][0].requires_grad
    mha(x)  # after the block: no more hooks
    assert len(records[""]) == 1


def test_recording_refuses_cached_decoding() -> None:
    mha = _mha(16, 4).eval()
    x = torch.randn(2, 1, 16)
    with record_attention_weights(mha), pytest.raises(ValueError, match="teacher-forced"):
        mha(x, is_causal=True, cache=KVCache())
    mha(x, is_causal=True, cache=KVCache())  # the hook is gone even after the error


# ------------------------------------------------------------------------------ KV cache


@pytest.mark.parametrize("fused", [True, False])
def test_self_attention_cache_equals_full_causal(fused: bool) -> None:
    mha = _mha(16, 4, fused=fused).eval()
    x = torch.randn(2, 5, 16)
    full = mha(x, is_causal=True)
    cache = KVCache()
    steps = [mha(x[:, t : t + 1], is_causal=True, cache=cache) for t in range(5)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-5)
    assert cache.k is not None and cache.k.shape == (2, 4, 5, 4)


def test_self_attention_cache_with_a_multi_token_chunk() -> None:
    # Two queries on top of three cached keys: queries are the last T of the cached positions.
    mha = _mha(16, 4).eval()
    x = torch.randn(2, 5, 16)
    cache = KVCache()
    first = mha(x[:, :3], is_causal=True, cache=cache)
    second = mha(x[:, 3:], is_causal=True, cache=cache)
    torch.testing.assert_close(
        torch.cat([first, second], dim=1), mha(x, is_causal=True), atol=1e-5, rtol=1e-5
    )


def test_kv_cache_append_grows_and_reorders() -> None:
    cache = KVCache()
    steps_k = [torch.randn(3, 2, 1, 4) for _ in range(40)]  # past the initial capacity of 16
    steps_v = [torch.randn(3, 2, 1, 5) for _ in range(40)]
    for t, (k, v) in enumerate(zip(steps_k, steps_v, strict=True), start=1):
        all_k, all_v = cache.append(k, v)
        assert all_k.shape == (3, 2, t, 4) and all_v.shape == (3, 2, t, 5)
    torch.testing.assert_close(cache.k, torch.cat(steps_k, dim=2), rtol=0, atol=0)
    torch.testing.assert_close(cache.v, torch.cat(steps_v, dim=2), rtol=0, atol=0)
    index = torch.tensor([2, 0])  # beam reordering and a finished row leaving the batch
    cache.reorder(index)
    torch.testing.assert_close(cache.k, torch.cat(steps_k, dim=2)[index], rtol=0, atol=0)
    k, v = cache.append(torch.ones(2, 2, 1, 4), torch.ones(2, 2, 1, 5))
    assert k.shape == (2, 2, 41, 4) and bool((k[:, :, -1] == 1).all())
    torch.testing.assert_close(v[:, :, :40], torch.cat(steps_v, dim=2)[index], rtol=0, atol=0)


def test_cross_attention_cache_computes_source_once() -> None:
    mha = _mha(16, 4).eval()
    memory = torch.randn(2, 7, 16)
    cache = KVCache()
    assert cache.is_empty
    y1 = mha(torch.randn(2, 1, 16), memory, cache=cache)
    k_first = cache.k
    # Later steps must not read `memory` again: pass garbage and expect the cached K/V.
    y2 = mha(torch.randn(2, 1, 16), torch.zeros(2, 7, 16), cache=cache)
    assert cache.k is not None and k_first is not None
    assert cache.k.data_ptr() == k_first.data_ptr()  # the same storage: not recomputed
    torch.testing.assert_close(cache.k, k_first, rtol=0, atol=0)
    assert y1.shape == y2.shape == (2, 1, 16)
    query = torch.randn(2, 1, 16)
    torch.testing.assert_close(mha(query, torch.zeros(2, 7, 16), cache=cache), mha(query, memory))


def test_eval_after_a_fused_optimizer_step_uses_the_new_weights() -> None:
    # Fused AdamW updates parameters without bumping their version counters: nothing derived
    # from the weights (e.g. packed QKV) may be cached across steps.
    mha = _mha(16, 4)
    x = torch.randn(2, 5, 16)
    mha.eval()
    with torch.no_grad():
        before = mha(x)
    mha.train()
    optimizer = torch.optim.AdamW(mha.parameters(), lr=0.1, fused=True)
    mha(x).square().sum().backward()
    optimizer.step()
    mha.eval()
    reference = _mha(16, 4).eval()
    reference.load_state_dict(mha.state_dict())
    with torch.no_grad():
        after = mha(x)
        torch.testing.assert_close(after, reference(x))
    assert not torch.allclose(after, before)


def test_kv_cache_with_gradients_keeps_autograd_working() -> None:
    mha = _mha(16, 4)
    cache = KVCache()
    xs = [torch.randn(2, 1, 16, requires_grad=True) for _ in range(3)]
    outputs = [mha(x, is_causal=True, cache=cache) for x in xs]
    torch.stack(outputs).sum().backward()  # would fail on in-place buffer writes
    assert all(x.grad is not None for x in xs)
