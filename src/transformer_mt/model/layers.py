"""Position-wise feed-forward network and the encoder/decoder layers (paper section 3.1, 3.3).

Where LayerNorm sits is the ``norm_first`` switch:

* ``norm_first=False`` (post-LN, the paper): ``x = LayerNorm(x + Dropout(Sublayer(x)))``.
* ``norm_first=True`` (pre-LN): ``x = x + Dropout(Sublayer(LayerNorm(x)))``; the stack then
  needs one final LayerNorm (see :class:`~transformer_mt.model.transformer.Encoder`). Pre-LN
  trains stably without a long warmup (Xiong et al., 2020, "On Layer Normalization in the
  Transformer Architecture"); post-LN is what the paper describes and often ends slightly
  better when it converges.

Every module here is built from the :class:`~transformer_mt.model.config.ModelConfig` whole.
"""

from __future__ import annotations

from collections.abc import Callable

import torch.nn.functional as F
from torch import Tensor, nn

from transformer_mt.model.attention import MultiHeadAttention
from transformer_mt.model.config import ModelConfig
from transformer_mt.model.dropout import Dropout
from transformer_mt.model.kv_cache import KVCache

_ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {"relu": F.relu, "gelu": F.gelu}


class PositionwiseFeedForward(nn.Module):
    """FFN(x) = max(0, x W_1 + b_1) W_2 + b_2, applied to each position separately (eq. 2).

    ``linear1``: ``d_model -> d_ff``, ``linear2``: ``d_ff -> d_model``; the non-linearity is
    ``config.activation`` (ReLU in the paper).
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.linear1 = nn.Linear(config.d_model, config.d_ff)
        self.linear2 = nn.Linear(config.d_ff, config.d_model)
        self.activation = _ACTIVATIONS[config.activation]
        # Dropout on the hidden activations, as in the reference tensor2tensor implementation
        # ("relu_dropout"); the paper only names residual dropout.
        self.dropout = Dropout(config.ffn_dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.linear2(self.dropout(self.activation(self.linear1(x))))  # (B, L, d_model)


class _Residual(nn.Module):
    """One sub-layer connection: residual + dropout + LayerNorm, in post- or pre-LN order."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(config.d_model)
        self.dropout = Dropout(config.dropout)
        self.norm_first = config.norm_first

    def forward(self, x: Tensor, sublayer: Callable[[Tensor], Tensor]) -> Tensor:
        if self.norm_first:
            return self.dropout.add(x, sublayer(self.norm(x)))  # x + Dropout(Sublayer(LN(x)))
        return self.norm(self.dropout.add(x, sublayer(x)))  # LN(x + Dropout(Sublayer(x)))


class EncoderLayer(nn.Module):
    """Self-attention then feed-forward, each wrapped in residual + dropout + LayerNorm.

    ``config.norm_first=False`` is the paper's post-LN; ``True`` is pre-LN (see the module
    docstring).
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.self_attn = MultiHeadAttention(config.attention)
        self.feed_forward = PositionwiseFeedForward(config)
        self.sublayer1 = _Residual(config)
        self.sublayer2 = _Residual(config)

    def forward(self, x: Tensor, src_mask: Tensor | None) -> Tensor:
        """``x (B, S, d_model)``, ``src_mask (B, 1, 1, S)`` -> ``(B, S, d_model)``."""
        x = self.sublayer1(x, lambda y: self.self_attn(y, mask=src_mask))
        return self.sublayer2(x, self.feed_forward)


class DecoderLayer(nn.Module):
    """Masked self-attention, cross-attention over the encoder output, then feed-forward.

    Each sub-layer is wrapped in residual + dropout + LayerNorm (post-LN by default, pre-LN
    with ``config.norm_first=True``). For incremental decoding pass a
    ``(self_cache, cross_cache)`` pair: self-attention appends the new step's keys/values,
    cross-attention computes the source keys/values on the first step only.
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.self_attn = MultiHeadAttention(config.attention)
        self.cross_attn = MultiHeadAttention(config.attention)
        self.feed_forward = PositionwiseFeedForward(config)
        self.sublayer1 = _Residual(config)
        self.sublayer2 = _Residual(config)
        self.sublayer3 = _Residual(config)

    def forward(
        self,
        x: Tensor,
        memory: Tensor,
        memory_mask: Tensor | None,
        tgt_mask: Tensor | None = None,
        cache: tuple[KVCache, KVCache] | None = None,
    ) -> Tensor:
        """``x (B, T, d_model)``, ``memory (B, S, d_model)`` -> ``(B, T, d_model)``.

        Args:
            memory_mask: source padding mask ``(B, 1, 1, S)``.
            tgt_mask: extra target mask (e.g. target padding) combined with the causal mask.
            cache: ``(self_cache, cross_cache)`` for incremental decoding.
        """
        self_cache, cross_cache = cache if cache is not None else (None, None)
        x = self.sublayer1(
            x, lambda y: self.self_attn(y, mask=tgt_mask, is_causal=True, cache=self_cache)
        )
        x = self.sublayer2(
            x, lambda y: self.cross_attn(y, memory, mask=memory_mask, cache=cross_cache)
        )
        return self.sublayer3(x, self.feed_forward)
