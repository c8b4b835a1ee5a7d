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

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from transformer_mt.model.dropout import dropout


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
    attn = dropout(weights, dropout_p) if dropout_p > 0.0 else weights
    return attn @ v, weights  # (B, H, T_q, d_v), (B, H, T_q, T_k)


class KVCache:
    """Keys and values of one attention layer kept between decoding steps.

    ``k``: ``(B, H, T_seen, d_k)``, ``v``: ``(B, H, T_seen, d_v)``. Self-attention appends one
    step at a time (:meth:`append`); cross-attention fills it once from the encoder output
    (:meth:`set`) and reuses it.

    Appending writes into a preallocated buffer whose length doubles when full, so a step costs
    one small copy instead of re-concatenating the whole history (``torch.cat`` per step is
    quadratic in the output length). ``k``/``v`` are views of the filled part.
    """

    def __init__(self) -> None:
        self._k: Tensor | None = None  # (B, H, capacity, d_k)
        self._v: Tensor | None = None  # (B, H, capacity, d_v)
        self.length = 0

    @property
    def k(self) -> Tensor | None:
        return None if self._k is None else self._k[:, :, : self.length]

    @property
    def v(self) -> Tensor | None:
        return None if self._v is None else self._v[:, :, : self.length]

    def set(self, k: Tensor, v: Tensor) -> None:
        """Store ``k``/``v`` as the whole cache (cross-attention)."""
        self._k, self._v, self.length = k, v, k.size(2)

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Add ``T`` new positions ``(B, H, T, d)``; return all keys and values so far."""
        if torch.is_grad_enabled() and (k.requires_grad or v.requires_grad):
            # Writing into a buffer that earlier steps' outputs view would break autograd:
            # concatenate instead (differentiable decoding is rare; search runs without grad).
            previous_k, previous_v = self.k, self.v
            if previous_k is not None and previous_v is not None:
                k, v = torch.cat([previous_k, k], dim=2), torch.cat([previous_v, v], dim=2)
            self.set(k, v)
            return k, v
        start, end = self.length, self.length + k.size(2)
        if self._k is None or self._v is None or end > self._k.size(2):
            capacity = max(16, end, 2 * start)
            self._k = _with_room(self._k, k, start, capacity)
            self._v = _with_room(self._v, v, start, capacity)
        self._k[:, :, start:end] = k
        self._v[:, :, start:end] = v
        self.length = end
        return self._k[:, :, :end], self._v[:, :, :end]

    def reorder(self, index: Tensor) -> None:
        """Select batch rows (beam search keeps the surviving hypotheses)."""
        if self._k is not None and self._v is not None:
            # The whole buffer (at most twice the filled part) in one copy, no temporary.
            self._k = self._k.index_select(0, index)
            self._v = self._v.index_select(0, index)


def _with_room(buffer: Tensor | None, new: Tensor, length: int, capacity: int) -> Tensor:
    """A ``(B, H, capacity, d)`` buffer like ``new`` holding the first ``length`` of ``buffer``."""
    grown = new.new_empty(*new.shape[:2], capacity, new.size(3))
    if buffer is not None and length:
        grown[:, :, :length] = buffer[:, :, :length]
    return grown


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
            The explicit path is selected automatically when weights are requested, for
            attention dropout on CPU (where SDPA would run the same unfused math) and for a
            single query on CPU (one decoding step).
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

    def _project(self, x: Tensor, *projections: nn.Linear) -> tuple[Tensor, ...]:
        """Apply several projections of the same input as one matmul; split into heads.

        ``x (B, L, d_model)`` -> one ``(B, H, L, d_head)`` tensor per projection, where
        ``d_head`` is ``d_k`` for ``q_proj``/``k_proj`` and ``d_v`` for ``v_proj``.
        """
        weights = [p.weight for p in projections]
        biases = [p.bias for p in projections]
        # Several projections are concatenated at every call, not cached: fused optimizers
        # update weights in place without bumping version counters, so a cache could not tell
        # that it is stale.
        weight = weights[0] if len(weights) == 1 else torch.cat(weights)  # (sum of outs, d)
        bias = None
        if all(b is not None for b in biases):
            bias = biases[0] if len(biases) == 1 else torch.cat(biases)  # type: ignore[arg-type]
        sizes = [p.out_features for p in projections]
        parts = F.linear(x, weight, bias).split(sizes, dim=-1)  # (B, L, size) each
        return tuple(
            self._split_heads(part, size // self.n_heads) for part, size in zip(parts, sizes)
        )

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
        reuse_kv = cache is not None and static_kv and cache.k is not None
        if reuse_kv:
            assert cache is not None
            (q,) = self._project(query, self.q_proj)
            k, v = cache.k, cache.v  # cross-attention: source K/V from the first step
        elif query is key and key is value:
            # Self-attention: Q, K and V in one matmul over the concatenated weights (one
            # large GEMM is faster than three small ones; the parameters stay separate, so
            # checkpoints and the paper's W^Q, W^K, W^V are unchanged).
            q, k, v = self._project(query, self.q_proj, self.k_proj, self.v_proj)
        elif key is value:
            # Cross-attention: K and V of the same memory in one matmul.
            (q,) = self._project(query, self.q_proj)
            k, v = self._project(key, self.k_proj, self.v_proj)
        else:
            (q,) = self._project(query, self.q_proj)
            (k,) = self._project(key, self.k_proj)
            (v,) = self._project(value, self.v_proj)
        if cache is not None and not reuse_kv:
            if static_kv:
                cache.set(k, v)
            else:
                k, v = cache.append(k, v)  # (B, H, T_seen + T, d_k), (B, H, T_seen + T, d_v)

        if mask is not None:
            mask = _as_4d(mask)
        T, S = q.size(2), k.size(2)
        dropout_p = self.dropout if self.training else 0.0
        # With attention dropout on CPU, SDPA runs its unfused math kernel anyway; the explicit
        # path is the same math with a cheaper dropout mask (transformer_mt.model.dropout). A single
        # query (cached decoding) on CPU is two small matmuls: the flash kernel's blocking costs
        # more than it saves (forward 0.92 vs 0.60 ms for 320 rows x 32 keys, 2 threads).
        on_cpu = q.device.type == "cpu"
        explicit = (
            not self.fused
            or need_weights
            or self.store_weights
            or (on_cpu and (dropout_p > 0.0 or T == 1))
        )

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
                    # path returns zeros. Keep the explicit path's contract. On CPU the check
                    # is cheap and skips the extra pass over the output when no such row
                    # exists (almost always); on an accelerator it would be a host sync, and
                    # under torch.compile a graph break, so those always mask.
                    attends = mask.any(dim=-1, keepdim=True)  # (B or 1, H or 1, T, 1)
                    cheap_check = on_cpu and not torch.compiler.is_compiling()
                    if not cheap_check or not bool(attends.all()):
                        out = out.masked_fill(~attends, 0.0)
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
