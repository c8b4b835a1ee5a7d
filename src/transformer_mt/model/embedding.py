"""Token embeddings and positional encodings (paper sections 3.4 and 3.5)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from transformer_mt.model.config import ModelConfig
from transformer_mt.model.dropout import Dropout


class TokenEmbedding(nn.Embedding):
    """Learned embeddings multiplied by sqrt(d_model) (section 3.4).

    The scaling keeps token embeddings on the same scale as the positional encodings when the
    weights are shared with the pre-softmax linear layer (initialised with std d_model^-0.5).
    """

    def __init__(self, vocab_size: int, d_model: int, pad_id: int | None = None) -> None:
        super().__init__(vocab_size, d_model, padding_idx=pad_id)
        self.d_model = d_model
        nn.init.normal_(self.weight, mean=0.0, std=d_model**-0.5)
        if pad_id is not None:
            with torch.no_grad():
                self.weight[pad_id].zero_()

    def forward(self, tokens: Tensor) -> Tensor:
        return super().forward(tokens) * math.sqrt(self.d_model)  # (B, L, d_model)


class SinusoidalPositionalEncoding(nn.Module):
    """PE(pos, 2i) = sin(pos / 10000^(2i/d_model)), PE(pos, 2i+1) = cos(...) (section 3.5).

    A fixed buffer (not a parameter), so it is not trained and not counted as a parameter.
    """

    def __init__(self, d_model: int, max_len: int = 1024) -> None:
        super().__init__()
        position = torch.arange(max_len, dtype=torch.float32)[:, None]  # (max_len, 1)
        inv_freq = torch.exp(
            torch.arange(0, d_model, 2, dtype=torch.float32) * (-math.log(10000.0) / d_model)
        )  # (ceil(d_model / 2),)
        pe = torch.zeros(max_len, d_model)
        pe[:, 0::2] = torch.sin(position * inv_freq)
        pe[:, 1::2] = torch.cos(position * inv_freq[: d_model // 2])
        self.register_buffer("pe", pe, persistent=False)  # (max_len, d_model)
        self.max_len = max_len

    def forward(self, length: int, offset: int = 0) -> Tensor:
        """Encodings of positions ``offset .. offset + length - 1``: ``(length, d_model)``."""
        if offset + length > self.max_len:
            raise ValueError(
                f"sequence of length {offset + length} exceeds max_len={self.max_len} of the "
                "positional encoding; raise model.max_len or filter longer sentences"
            )
        return self.pe[offset : offset + length]

    def at(self, position: Tensor) -> Tensor:
        """The encoding of the positions in the long tensor ``position``: ``(*position.shape,
        d_model)``, read without a host sync (a compiled decoding step passes its step as a
        tensor)."""
        return F.embedding(position, self.pe)  # a lookup, where pe[position] would sync


class LearnedPositionalEncoding(nn.Module):
    """Learned absolute positions, the alternative the paper compares in Table 3 row (E)."""

    def __init__(self, d_model: int, max_len: int = 1024) -> None:
        super().__init__()
        self.embedding = nn.Embedding(max_len, d_model)
        nn.init.normal_(self.embedding.weight, mean=0.0, std=d_model**-0.5)
        self.max_len = max_len

    def forward(self, length: int, offset: int = 0) -> Tensor:
        if offset + length > self.max_len:
            raise ValueError(
                f"sequence of length {offset + length} exceeds max_len={self.max_len} of the "
                "positional embedding; raise model.max_len or filter longer sentences"
            )
        positions = torch.arange(offset, offset + length, device=self.embedding.weight.device)
        return self.embedding(positions)  # (length, d_model)

    def at(self, position: Tensor) -> Tensor:
        """The embedding of the positions in the long tensor ``position``: ``(*position.shape,
        d_model)`` (see :meth:`SinusoidalPositionalEncoding.at`)."""
        return self.embedding(position)


class TransformerEmbedding(nn.Module):
    """Token embedding + positional encoding, then dropout on the sum (section 5.4).

    ``token`` is passed in (not built here) so that encoder and decoder can share one matrix;
    the positional encoding (``config.positional``), ``max_len`` and dropout come from the
    config.
    """

    def __init__(self, token: TokenEmbedding, config: ModelConfig) -> None:
        super().__init__()
        self.token = token
        positional = _POSITIONAL[config.positional]
        self.position: nn.Module = positional(config.d_model, config.max_len)
        self.dropout = Dropout(config.dropout)

    def forward(self, tokens: Tensor, offset: int = 0) -> Tensor:
        """``tokens (B, L)`` -> ``(B, L, d_model)``; ``offset`` is the first position's index."""
        x = self.token(tokens) + self.position(tokens.size(1), offset)  # (B, L, d_model)
        return self.dropout(x)


#: ``ModelConfig.positional`` -> encoding class (the config validates the name).
_POSITIONAL: dict[str, type[nn.Module]] = {
    "sinusoidal": SinusoidalPositionalEncoding,
    "learned": LearnedPositionalEncoding,
}
