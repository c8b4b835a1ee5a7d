"""Scaled dot-product attention and multi-head attention (Vaswani et al., 2017, section 3.2).

Shape letters used in every comment of this package:

    B  batch size
    S  source length (keys/values of cross-attention, encoder positions)
    T  target length (queries; decoder positions)
    H  number of heads
    d_k, d_v  per-head query/key and value sizes

Mask convention (one for the whole package): a boolean tensor, ``True`` = "may attend",
broadcastable to ``(B, H, T_q, T_k)``. It is the polarity ``F.scaled_dot_product_attention``
uses, so the fused path takes our masks unchanged. Build masks with :func:`padding_mask` and
:func:`causal_mask` and combine them with ``&``.

Attention exists twice on purpose: :func:`scaled_dot_product_attention` is the paper's math,
written out so it can be read and so it can return the attention weights for plots; the fused
path calls ``torch.nn.functional.scaled_dot_product_attention``, which is faster and uses less
memory (flash / memory-efficient kernels). Tests hold the two equal.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def padding_mask(tokens: Tensor, pad_id: int) -> Tensor:
    """Mask of the non-pad key positions, ``(B, 1, 1, S)``: True where a token may be attended."""
    return (tokens != pad_id)[:, None, None, :]  # (B, 1, 1, S)


def causal_mask(length: int, device: torch.device | None = None) -> Tensor:
    """Lower-triangular mask ``(1, 1, T, T)``: position t may attend to positions <= t."""
    return torch.ones(length, length, dtype=torch.bool, device=device).tril()[None, None]


def _as_4d(mask: Tensor) -> Tensor:
    """Check a mask and bring ``(B, T_q, T_k)`` to ``(B, 1, T_q, T_k)``; 4-D masks pass through."""
    if mask.dtype != torch.bool:
        raise ValueError(
            f"attention masks must be boolean (True = may attend), got dtype {mask.dtype}; "
            "build them with padding_mask()/causal_mask()"
        )
    if mask.dim() == 3:  # (B, T_q, T_k) -> (B, 1, T_q, T_k): the same mask for every head
        return mask[:, None]
    if mask.dim() != 4:
        raise ValueError(
            f"attention mask must have 3 or 4 dims broadcastable to (B, H, T_q, T_k), "
            f"got shape {tuple(mask.shape)}"
        )
    return mask


def scaled_dot_product_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    dropout_p: float = 0.0,
) -> tuple[Tensor, Tensor]:
    """Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V, equation (1) of the paper.

    Args:
        q: queries ``(B, H, T_q, d_k)``.
        k: keys ``(B, H, T_k, d_k)``.
        v: values ``(B, H, T_k, d_v)``.
        mask: boolean, True = may attend, broadcastable to ``(B, H, T_q, T_k)``.
        dropout_p: dropout on the attention weights (pass 0.0 in eval mode).

    Returns:
        ``(output, weights)``: output ``(B, H, T_q, d_v)`` and the attention weights
        ``(B, H, T_q, T_k)`` (before dropout). A query whose keys are all masked gets zero
        weights and a zero output, never NaN.
    """
    d_k = q.size(-1)
    scores = q @ k.transpose(-2, -1) / math.sqrt(d_k)  # (B, H, T_q, T_k)
    if mask is not None:
        # The dtype's own minimum, not a literal like -1e9, which overflows in fp16 and is not
        # small enough to vanish for large fp32 scores.
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    weights = scores.softmax(dim=-1)  # (B, H, T_q, T_k)
    if mask is not None:
        # A fully masked row softmaxes to a uniform distribution over masked keys; zero it so
        # that padding queries read nothing instead of an average of padding.
        weights = weights.masked_fill(~mask, 0.0)
    attn = F.dropout(weights, p=dropout_p) if dropout_p > 0.0 else weights
    return attn @ v, weights  # (B, H, T_q, d_v), (B, H, T_q, T_k)


@dataclass
class KVCache:
    """Keys and values of one attention layer kept between decoding steps.

    ``k``: ``(B, H, T_seen, d_k)``, ``v``: ``(B, H, T_seen, d_v)``. Self-attention appends one
    step at a time; cross-attention fills it once from the encoder output and reuses it.
    """

    k: Tensor | None = None
    v: Tensor | None = None

    def reorder(self, index: Tensor) -> None:
        """Select batch rows (beam search keeps the surviving hypotheses)."""
        if self.k is not None and self.v is not None:
            self.k = self.k.index_select(0, index)
            self.v = self.v.index_select(0, index)


class MultiHeadAttention(nn.Module):
    """MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W^O with head_i = Attention(Q W_i^Q, ...).

    Each of the ``n_heads`` heads has its own ``d_k``-sized query/key projection and ``d_v``-sized
    value projection, so ``q_proj``/``k_proj`` map ``d_model -> n_heads * d_k`` and ``v_proj``
    maps ``d_model -> n_heads * d_v``; ``out_proj`` maps ``n_heads * d_v -> d_model``. With the
    defaults ``d_k = d_v = d_model // n_heads`` the cost matches single-head attention with full
    dimensionality (section 3.2.2).

    Args:
        d_model: model width.
        n_heads: number of heads h.
        d_k, d_v: per-head sizes (default ``d_model // n_heads``).
        dropout: dropout on the attention weights, applied only in training.
        bias: whether the four projections have biases.
        fused: use ``F.scaled_dot_product_attention`` (True) or the explicit paper math (False).
            The explicit path is selected automatically when weights are requested.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        d_k: int | None = None,
        d_v: int | None = None,
        dropout: float = 0.0,
        bias: bool = True,
        fused: bool = True,
    ) -> None:
        super().__init__()
        if n_heads < 1:
            raise ValueError(f"n_heads must be >= 1, got {n_heads}")
        if (d_k is None or d_v is None) and d_model % n_heads != 0:
            raise ValueError(
                f"d_model={d_model} is not divisible by n_heads={n_heads}; choose n_heads that "
                f"divides d_model (e.g. {_divisor_hint(d_model, n_heads)}) or set d_k and d_v"
            )
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"attention dropout must be in [0, 1), got {dropout}")
        self.d_model = d_model
        self.n_heads = n_heads
        self.d_k = d_k if d_k is not None else d_model // n_heads
        self.d_v = d_v if d_v is not None else d_model // n_heads
        self.dropout = dropout
        self.fused = fused
        self.q_proj = nn.Linear(d_model, n_heads * self.d_k, bias=bias)
        self.k_proj = nn.Linear(d_model, n_heads * self.d_k, bias=bias)
        self.v_proj = nn.Linear(d_model, n_heads * self.d_v, bias=bias)
        self.out_proj = nn.Linear(n_heads * self.d_v, d_model, bias=bias)
        #: weights of the last forward call, ``(B, H, T_q, T_k)``, when ``store_weights`` is set
        self.last_weights: Tensor | None = None
        self.store_weights = False

    def _split_heads(self, x: Tensor, d_head: int) -> Tensor:
        B, L, _ = x.shape
        return x.view(B, L, self.n_heads, d_head).transpose(1, 2)  # (B, H, L, d_head)

    def forward(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        mask: Tensor | None = None,
        is_causal: bool = False,
        cache: KVCache | None = None,
        static_kv: bool = False,
        need_weights: bool = False,
    ) -> Tensor | tuple[Tensor, Tensor]:
        """Attend from ``query (B, T, d_model)`` to ``key``/``value (B, S, d_model)``.

        Args:
            mask: boolean, True = may attend, broadcastable to ``(B, H, T, S)``; accepted shapes
                include ``(B, 1, 1, S)`` (padding), ``(1, 1, T, T)`` (causal) and ``(B, T, S)``.
            is_causal: add a causal mask (query t attends to keys <= t). With a cache the
                causal structure is implicit (one new query attends to all cached keys).
            cache: a :class:`KVCache` for incremental decoding. For self-attention the new
                step's keys/values are appended; with ``static_kv=True`` (cross-attention) the
                keys/values are computed from ``key``/``value`` once and reused afterwards.
            need_weights: also return the attention weights ``(B, H, T, S)`` (explicit path).

        Returns:
            ``(B, T, d_model)``, or ``(output, weights)`` when ``need_weights``.
        """
        q = self._split_heads(self.q_proj(query), self.d_k)  # (B, H, T, d_k)
        if cache is not None and static_kv and cache.k is not None:
            k, v = cache.k, cache.v  # cross-attention: source K/V computed at the first step
        else:
            k = self._split_heads(self.k_proj(key), self.d_k)  # (B, H, S, d_k)
            v = self._split_heads(self.v_proj(value), self.d_v)  # (B, H, S, d_v)
            if cache is not None:
                if not static_kv and cache.k is not None:
                    k = torch.cat([cache.k, k], dim=2)  # (B, H, T_seen + T, d_k)
                    v = torch.cat([cache.v, v], dim=2)  # (B, H, T_seen + T, d_v)
                cache.k, cache.v = k, v
        assert v is not None

        if mask is not None:
            mask = _as_4d(mask)
        T, S = q.size(2), k.size(2)
        dropout_p = self.dropout if self.training else 0.0
        explicit = not self.fused or need_weights or self.store_weights

        if is_causal and mask is None and T == S and not explicit:
            # The fused kernel builds the causal structure itself (no mask tensor to read).
            out = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True)
            weights: Tensor | None = None
        else:
            if is_causal and T > 1:  # one query (cached decoding) may see every cached key
                # Queries are the last T of S positions (S > T when keys come from a cache).
                causal = torch.ones(T, S, dtype=torch.bool, device=q.device).tril(S - T)
                mask = causal[None, None] if mask is None else mask & causal  # (B, H, T, S)
            if explicit:
                out, weights = scaled_dot_product_attention(q, k, v, mask, dropout_p)
                if self.store_weights:
                    self.last_weights = weights.detach()
            else:
                out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p)
                weights = None
                if mask is not None:
                    # SDPA may return NaN for a query whose keys are all masked; the explicit
                    # path returns zeros. Keep the explicit path's contract.
                    out = out.masked_fill(~mask.any(dim=-1, keepdim=True), 0.0)
        B, _, T, _ = out.shape
        out = out.transpose(1, 2).reshape(B, T, self.n_heads * self.d_v)  # (B, T, H * d_v)
        out = self.out_proj(out)  # (B, T, d_model)
        if need_weights:
            assert weights is not None
            return out, weights
        return out


def _divisor_hint(d_model: int, n_heads: int) -> str:
    divisors = [h for h in range(1, min(d_model, 64) + 1) if d_model % h == 0]
    nearest = sorted(divisors, key=lambda h: abs(h - n_heads))[:2]
    return " or ".join(f"n_heads={h}" for h in sorted(nearest))
