"""Scaled dot-product attention and multi-head attention (Vaswani et al., 2017, section 3.2).

Shape letters used in every comment of this package:

    B  batch size
    S  source length (keys/values of cross-attention, encoder positions)
    T  target length (queries; decoder positions)
    T_q, T_k  query and key lengths where both kinds of attention meet (T_k = S or T)
    L  any sequence length (S or T), where a helper serves both
    H  number of heads
    d_k, d_v  per-head query/key and value sizes

Mask convention (one for the whole package): a boolean tensor, ``True`` = "may attend",
broadcastable to ``(B, H, T_q, T_k)``. It is the polarity ``F.scaled_dot_product_attention``
uses, so the fused path takes our masks unchanged. Build masks with :func:`padding_mask` and
:func:`causal_mask` and combine them with ``&``.

Attention exists twice on purpose: :func:`scaled_dot_product_attention` is the paper's math,
written out so it can be read and so it can give the attention weights for plots; the fused
path calls ``torch.nn.functional.scaled_dot_product_attention``, which is faster and uses less
memory (flash / memory-efficient kernels). Tests hold the two equal.

Attention weights for plots come from :func:`record_attention_weights`, a context manager over
forward hooks; :meth:`MultiHeadAttention.forward` itself always returns one tensor.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from transformer_mt.model.config import AttentionConfig
from transformer_mt.model.dropout import dropout
from transformer_mt.model.kv_cache import KVCache


def padding_mask(tokens: Tensor, pad_id: int) -> Tensor:
    """Mask of the non-pad key positions, ``(B, 1, 1, S)``: True where a token may be attended."""
    return (tokens != pad_id)[:, None, None, :]  # (B, 1, 1, S)


def causal_mask(length: int, device: torch.device | None = None) -> Tensor:
    """Lower-triangular mask ``(1, 1, T, T)``: position t may attend to positions <= t."""
    return torch.ones(length, length, dtype=torch.bool, device=device).tril()[None, None]


def attention_weights(q: Tensor, k: Tensor, mask: Tensor | None = None) -> Tensor:
    """The attention weights softmax(Q K^T / sqrt(d_k)), ``(B, H, T_q, T_k)``.

    ``q``: ``(B, H, T_q, d_k)``, ``k``: ``(B, H, T_k, d_k)``; ``mask``: boolean, True = may
    attend, broadcastable to ``(B, H, T_q, T_k)``. A query whose keys are all masked gets zero
    weights, never NaN.
    """
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))  # (B, H, T_q, T_k)
    if mask is None:
        return scores.softmax(dim=-1)  # (B, H, T_q, T_k)
    # The dtype's own minimum, not a literal like -1e9, which overflows in fp16 and is not
    # small enough to vanish for large fp32 scores.
    scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    # A fully masked row softmaxes to a uniform distribution over masked keys; zero it so
    # that padding queries read nothing instead of an average of padding.
    return scores.softmax(dim=-1).masked_fill(~mask, 0.0)  # (B, H, T_q, T_k)


def scaled_dot_product_attention(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, dropout_p: float = 0.0
) -> tuple[Tensor, Tensor]:
    """Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V, equation (1) of the paper.

    Args:
        q: queries ``(B, H, T_q, d_k)``.
        k: keys ``(B, H, T_k, d_k)``.
        v: values ``(B, H, T_k, d_v)``.
        mask: boolean, True = may attend, broadcastable to ``(B, H, T_q, T_k)``.
        dropout_p: dropout on the attention weights (pass 0.0 in eval mode).

    Returns:
        ``(output (B, H, T_q, d_v), weights (B, H, T_q, T_k))``, the weights before dropout.
        A query whose keys are all masked gets zero weights and a zero output, never NaN.
    """
    weights = attention_weights(q, k, mask)  # (B, H, T_q, T_k)
    attn = dropout(weights, dropout_p) if dropout_p > 0.0 else weights
    return attn @ v, weights  # (B, H, T_q, d_v), (B, H, T_q, T_k)


def _fused_attention(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, *, is_causal: bool, cross: bool, p: float
) -> Tensor:
    """``F.scaled_dot_product_attention`` under the explicit path's contract: ``(B, H, T, d_v)``,
    zeros (never NaN) for a query whose keys are all masked."""
    if is_causal and mask is None and not cross and k.size(2) == q.size(2):
        # The fused kernel builds the causal structure itself (no mask tensor to read).
        return F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
    mask = _combine_masks(mask, q, k, is_causal=is_causal, cross=cross)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p)
    if mask is None:
        return out
    # SDPA may return NaN for a query whose keys are all masked. On CPU the check is cheap and
    # skips the extra pass over the output when no such row exists (almost always); on an
    # accelerator it would be a host sync, and under torch.compile a graph break, so those
    # always mask.
    attends = mask.any(dim=-1, keepdim=True)  # (B or 1, H or 1, T, 1)
    cheap_check = q.device.type == "cpu" and not torch.compiler.is_compiling()
    if not cheap_check or not bool(attends.all()):
        out = out.masked_fill(~attends, 0.0)  # (B, H, T, d_v)
    return out


class MultiHeadAttention(nn.Module):
    """MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W^O with head_i = Attention(Q W_i^Q, ...).

    Each of the ``n_heads`` heads has its own ``d_k``-sized query/key projection and ``d_v``-sized
    value projection, so ``q_proj``/``k_proj`` map ``d_model -> n_heads * d_k`` and ``v_proj``
    maps ``d_model -> n_heads * d_v``; ``out_proj`` maps ``n_heads * d_v -> d_model``. With the
    defaults ``d_k = d_v = d_model // n_heads`` the cost matches single-head attention with full
    dimensionality (section 3.2.2). The sizes come from an :class:`AttentionConfig`
    (``ModelConfig.attention``), validated where it was built.

    ``fused`` (from the config; a plain attribute, so tests may switch it) selects
    ``F.scaled_dot_product_attention`` or the explicit paper math. The explicit path also runs
    for attention dropout on CPU (where SDPA would run the same unfused math, with a costlier
    dropout mask) and for a single query on CPU (one decoding step).
    """

    def __init__(self, config: AttentionConfig) -> None:
        super().__init__()
        c = config
        self.d_model, self.n_heads, self.d_k, self.d_v = c.d_model, c.n_heads, c.d_k, c.d_v
        self.dropout = c.dropout
        self.fused = c.fused
        self.q_proj = nn.Linear(c.d_model, c.n_heads * c.d_k, bias=c.bias)
        self.k_proj = nn.Linear(c.d_model, c.n_heads * c.d_k, bias=c.bias)
        self.v_proj = nn.Linear(c.d_model, c.n_heads * c.d_v, bias=c.bias)
        self.out_proj = nn.Linear(c.n_heads * c.d_v, c.d_model, bias=c.bias)

    def forward(
        self,
        x: Tensor,
        memory: Tensor | None = None,
        *,
        mask: Tensor | None = None,
        is_causal: bool = False,
        cache: KVCache | None = None,
    ) -> Tensor:
        """Attend from ``x (B, T, d_model)``; return ``(B, T, d_model)``.

        Args:
            x: the queries' input; for self-attention also the keys' and values'.
            memory: ``None`` = self-attention (queries, keys and values all from ``x``);
                ``(B, S, d_model)`` = cross-attention (keys and values from ``memory``, e.g.
                the encoder output).
            mask: boolean, True = may attend, broadcastable to ``(B, H, T, T_k)``, e.g.
                ``(B, 1, 1, S)`` (padding), ``(1, 1, T, T)`` (causal) or ``(B, T, T_k)``
                (one mask for every head).
            is_causal: self-attention only: query t also may not attend to keys after t.
                With a cache the queries are the last ``T`` of the cached positions.
            cache: a :class:`KVCache` for incremental decoding. Self-attention appends the new
                positions' keys/values and attends to all of them; cross-attention fills the
                cache from ``memory`` on the first call and reuses it afterwards (later calls
                do not read ``memory``).

        To also get the attention weights, wrap the call in :func:`record_attention_weights`.
        """
        q, k, v = self._qkv(x, memory, cache)  # (B, H, T, d_k), (B, H, T_k, d_k / d_v)
        dropout_p = self.dropout if self.training else 0.0
        cross = memory is not None
        if self._paper_math(q, dropout_p):
            mask = _combine_masks(mask, q, k, is_causal=is_causal, cross=cross)
            out, _ = scaled_dot_product_attention(q, k, v, mask, dropout_p)  # (B, H, T, d_v)
        else:
            out = _fused_attention(q, k, v, mask, is_causal=is_causal, cross=cross, p=dropout_p)
        T = q.size(2)
        B = out.size(0)
        out = out.transpose(1, 2).reshape(B, T, self.n_heads * self.d_v)  # (B, T, H * d_v)
        return self.out_proj(out)  # (B, T, d_model)

    def _paper_math(self, q: Tensor, dropout_p: float) -> bool:
        """True where the explicit math of equation (1) runs, False for the fused kernel.

        The explicit path runs when ``fused`` is off, and on CPU also where it is the faster
        of the two: with attention dropout (SDPA runs its unfused math kernel then anyway,
        with a costlier dropout mask than :mod:`transformer_mt.model.dropout`'s), and for a
        single query (a cached decoding step: two small matmuls, where the fused kernel's
        blocking costs more than it saves; docs/benchmarks.md), and for half-precision
        queries that autograd will differentiate (bf16 autocast in training): the CPU flash
        kernel's bf16 backward is many times slower than its fp32 one, while the explicit
        matmuls run on the bf16 units (AMX). Without a backward the fused kernel stays: its
        bf16 forward keeps up with the explicit math's.
        """
        if not self.fused:
            return True
        if q.device.type != "cpu":
            return False
        half = q.dtype in (torch.bfloat16, torch.float16)
        return dropout_p > 0.0 or q.size(2) == 1 or (q.requires_grad and half)

    def compute_weights(
        self,
        x: Tensor,
        memory: Tensor | None = None,
        *,
        mask: Tensor | None = None,
        is_causal: bool = False,
    ) -> Tensor:
        """The attention weights ``(B, H, T, T_k)`` :meth:`forward` applies for these inputs.

        The explicit paper math (:func:`attention_weights`) over the same projections, before
        attention dropout; arguments as in :meth:`forward` (no cache: a teacher-forced pass).
        """
        (q,) = self._project(x, self.q_proj)  # (B, H, T, d_k)
        (k,) = self._project(x if memory is None else memory, self.k_proj)  # (B, H, T_k, d_k)
        mask = _combine_masks(mask, q, k, is_causal=is_causal, cross=memory is not None)
        return attention_weights(q, k, mask)  # (B, H, T, T_k)

    def _qkv(
        self, x: Tensor, memory: Tensor | None, cache: KVCache | None
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Queries ``(B, H, T, d_k)``, keys ``(B, H, T_k, d_k)`` and values ``(B, H, T_k, d_v)``."""
        if memory is None:
            # Self-attention: Q, K and V in one matmul over the concatenated weights (one
            # large GEMM is faster than three small ones; the parameters stay separate, so
            # checkpoints and the paper's W^Q, W^K, W^V are unchanged).
            q, k, v = self._project(x, self.q_proj, self.k_proj, self.v_proj)
            if cache is not None:
                k, v = cache.append(k, v)  # (B, H, T_seen + T, d_k), (B, H, T_seen + T, d_v)
            return q, k, v
        (q,) = self._project(x, self.q_proj)
        if cache is not None and not cache.is_empty:
            return q, cache.k, cache.v  # type: ignore[return-value]  # the first step's K/V
        k, v = self._project(memory, self.k_proj, self.v_proj)  # K and V in one matmul
        if cache is not None:
            cache.set(k, v)
        return q, k, v

    def _project(self, x: Tensor, *projections: nn.Linear) -> tuple[Tensor, ...]:
        """Apply several projections of the same input as one matmul; split into heads.

        ``x (B, L, d_model)`` -> one ``(B, H, L, d_head)`` tensor per projection, where
        ``d_head`` is ``d_k`` for ``q_proj``/``k_proj`` and ``d_v`` for ``v_proj``.
        """
        sizes = [p.out_features for p in projections]
        if len(projections) == 1 or not all(isinstance(p, nn.Linear) for p in projections):
            # Quantized (int8) layers hold packed weights: each runs as its own module.
            parts = tuple(p(x) for p in projections)
        else:
            # Joined at every call, never cached: fused optimizers update weights in place
            # without bumping version counters, so a cache could not tell it is stale.
            weight = torch.cat([p.weight for p in projections])  # (sum of outs, d_model)
            biases = [p.bias for p in projections if p.bias is not None]
            bias = torch.cat(biases) if biases else None  # (sum of outs,)
            parts = F.linear(x, weight, bias).split(sizes, dim=-1)  # (B, L, H * d_head) each
        B, L, _ = x.shape
        return tuple(
            part.view(B, L, self.n_heads, size // self.n_heads).transpose(1, 2)  # (B, H, L, d)
            for part, size in zip(parts, sizes, strict=True)
        )


def _combine_masks(
    mask: Tensor | None, q: Tensor, k: Tensor, *, is_causal: bool, cross: bool
) -> Tensor | None:
    """Check ``mask`` and add the causal structure: the mask to apply, ``(B|1, H|1, T, T_k)``.

    ``q (B, H, T, d_k)`` and ``k (B, H, T_k, d_k)`` give the sizes and the device.
    """
    T, T_k = q.size(2), k.size(2)
    if mask is not None:
        if mask.dtype != torch.bool:
            raise ValueError(
                f"attention masks must be boolean (True = may attend), got dtype {mask.dtype}; "
                "build them with padding_mask()/causal_mask()"
            )
        if mask.dim() == 3:  # (B, T, T_k) -> (B, 1, T, T_k): the same mask for every head
            mask = mask[:, None]
        elif mask.dim() != 4:
            raise ValueError(
                "attention mask must have 3 or 4 dims broadcastable to (B, H, T_q, T_k), "
                f"got shape {tuple(mask.shape)}"
            )
    if is_causal and cross:
        raise ValueError("is_causal is for self-attention; cross-attention sees all of memory")
    if not is_causal or T == 1:  # one new query (cached decoding) may see every cached key
        return mask
    # Queries are the last T of T_k positions (T_k > T when keys come from a cache).
    causal = torch.ones(T, T_k, dtype=torch.bool, device=q.device).tril(T_k - T)  # (T, T_k)
    return causal[None, None] if mask is None else mask & causal  # (B|1, H|1, T, T_k)


@contextmanager
def record_attention_weights(model: nn.Module) -> Iterator[dict[str, list[Tensor]]]:
    """Collect the attention weights of every :class:`MultiHeadAttention` in ``model``.

    Within the ``with`` block, each forward call of an attention layer appends its weights
    ``(B, H, T_q, T_k)`` (:meth:`MultiHeadAttention.compute_weights`: the explicit math on the
    call's inputs, detached) to ``records[name]``, where ``name`` is the layer's module name,
    e.g. ``decoder.layers.0.cross_attn``. The forward pass itself is unchanged (same path, same
    output, same random stream); the hooks are removed on leaving the block. Calls with a
    :class:`KVCache` are refused (record a teacher-forced pass)::

        with record_attention_weights(model) as records:
            model(src, tgt_in)
        cross = records["decoder.layers.0.cross_attn"][0]  # (B, H, T, S)
    """
    records: dict[str, list[Tensor]] = {}
    handles = []

    def hook(name: str) -> Any:
        def record(
            module: MultiHeadAttention, args: tuple, kwargs: dict[str, Any], output: Tensor
        ) -> None:
            if kwargs.get("cache") is not None:
                raise ValueError(
                    f"record_attention_weights: {name} was called with a KV cache; record a "
                    "teacher-forced pass (model(src, tgt_in)) instead of cached decoding"
                )
            kwargs = {key: value for key, value in kwargs.items() if key != "cache"}
            with torch.no_grad():
                records.setdefault(name, []).append(
                    module.compute_weights(*args, **kwargs).detach()
                )

        return record

    for name, module in model.named_modules():
        if isinstance(module, MultiHeadAttention):
            handles.append(module.register_forward_hook(hook(name), with_kwargs=True))
    try:
        yield records
    finally:
        for handle in handles:
            handle.remove()
