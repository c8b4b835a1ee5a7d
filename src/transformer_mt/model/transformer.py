"""The Transformer (Figure 1 of the paper): Encoder, Decoder and the model that joins them.

This module imports only torch: it works without Lightning or Hydra.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

from torch import Tensor, nn

from transformer_mt.model.attention import KVCache, MultiHeadAttention, padding_mask
from transformer_mt.model.embedding import TokenEmbedding, TransformerEmbedding
from transformer_mt.model.layers import DecoderLayer, EncoderLayer


@dataclass
class ModelConfig:
    """Every size and switch of the model, in the paper's vocabulary.

    ``src_vocab_size``, ``tgt_vocab_size`` and ``pad_id`` come from the tokenizer (never typed
    twice). Defaults are the paper's base model (Table 3).

    Attributes:
        tie_embeddings: share the decoder's input embedding with the pre-softmax linear layer.
        share_encoder_decoder_embeddings: one embedding matrix for source and target
            (needs a joint vocabulary, i.e. equal vocabulary sizes). With both switches on,
            the three matrices of section 3.4 are one tensor.
        norm_first: False = post-LN (the paper), True = pre-LN with a final LayerNorm.
        fused_attention: use ``F.scaled_dot_product_attention`` (True) or the explicit math.
    """

    src_vocab_size: int
    tgt_vocab_size: int
    pad_id: int = 0
    d_model: int = 512
    n_heads: int = 8
    d_k: int | None = None
    d_v: int | None = None
    d_ff: int = 2048
    n_encoder_layers: int = 6
    n_decoder_layers: int = 6
    dropout: float = 0.1
    attention_dropout: float = 0.0
    activation: str = "relu"
    norm_first: bool = False
    tie_embeddings: bool = True
    share_encoder_decoder_embeddings: bool = True
    max_len: int = 1024
    positional: str = "sinusoidal"
    fused_attention: bool = True

    def __post_init__(self) -> None:
        for name in ("src_vocab_size", "tgt_vocab_size", "d_model", "n_heads", "d_ff", "max_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"model.{name} must be >= 1, got {getattr(self, name)}")
        for name in ("n_encoder_layers", "n_decoder_layers"):
            if getattr(self, name) < 1:
                raise ValueError(f"model.{name} must be >= 1, got {getattr(self, name)}")
        if (self.d_k is None or self.d_v is None) and self.d_model % self.n_heads != 0:
            raise ValueError(
                f"model.d_model={self.d_model} is not divisible by model.n_heads={self.n_heads}; "
                "pick n_heads that divides d_model, or set model.d_k and model.d_v explicitly"
            )
        for name in ("dropout", "attention_dropout"):
            value = getattr(self, name)
            if not 0.0 <= value < 1.0:
                raise ValueError(f"model.{name} must be in [0, 1), got {value}")
        if not 0 <= self.pad_id < min(self.src_vocab_size, self.tgt_vocab_size):
            raise ValueError(
                f"pad_id={self.pad_id} is outside the vocabularies "
                f"({self.src_vocab_size}, {self.tgt_vocab_size})"
            )
        if self.share_encoder_decoder_embeddings and self.src_vocab_size != self.tgt_vocab_size:
            raise ValueError(
                "share_encoder_decoder_embeddings needs one joint vocabulary, but "
                f"src_vocab_size={self.src_vocab_size} != tgt_vocab_size={self.tgt_vocab_size}; "
                "train a joint tokenizer or set model.share_encoder_decoder_embeddings=false"
            )

    def to_dict(self) -> dict[str, Any]:
        """Plain types only, so a checkpoint holding it loads with ``weights_only=True``."""
        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> ModelConfig:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown model config keys {unknown}; known keys: {sorted(known)}")
        return cls(**values)


class Encoder(nn.Module):
    """A stack of N :class:`EncoderLayer` (plus a final LayerNorm in pre-LN mode)."""

    def __init__(self, config: ModelConfig, embedding: TransformerEmbedding) -> None:
        super().__init__()
        self.embedding = embedding
        self.layers = nn.ModuleList(
            EncoderLayer(
                config.d_model,
                config.n_heads,
                config.d_ff,
                config.dropout,
                config.attention_dropout,
                config.activation,
                config.norm_first,
                config.d_k,
                config.d_v,
                config.fused_attention,
            )
            for _ in range(config.n_encoder_layers)
        )
        # Pre-LN leaves the residual stream un-normalised; normalise it once at the end.
        self.norm = nn.LayerNorm(config.d_model) if config.norm_first else nn.Identity()

    def forward(self, src: Tensor, src_mask: Tensor | None) -> Tensor:
        """``src (B, S)`` token ids -> ``(B, S, d_model)``."""
        x = self.embedding(src)  # (B, S, d_model)
        for layer in self.layers:
            x = layer(x, src_mask)
        return self.norm(x)


class Decoder(nn.Module):
    """A stack of N :class:`DecoderLayer` (plus a final LayerNorm in pre-LN mode)."""

    def __init__(self, config: ModelConfig, embedding: TransformerEmbedding) -> None:
        super().__init__()
        self.embedding = embedding
        self.layers = nn.ModuleList(
            DecoderLayer(
                config.d_model,
                config.n_heads,
                config.d_ff,
                config.dropout,
                config.attention_dropout,
                config.activation,
                config.norm_first,
                config.d_k,
                config.d_v,
                config.fused_attention,
            )
            for _ in range(config.n_decoder_layers)
        )
        self.norm = nn.LayerNorm(config.d_model) if config.norm_first else nn.Identity()

    def forward(
        self,
        tgt_in: Tensor,
        memory: Tensor,
        memory_mask: Tensor | None,
        cache: list[tuple[KVCache, KVCache]] | None = None,
        offset: int = 0,
    ) -> Tensor:
        """``tgt_in (B, T)`` -> ``(B, T, d_model)``; ``offset`` = position of ``tgt_in[:, 0]``."""
        x = self.embedding(tgt_in, offset)  # (B, T, d_model)
        for i, layer in enumerate(self.layers):
            x = layer(x, memory, memory_mask, cache=cache[i] if cache is not None else None)
        return self.norm(x)


class Transformer(nn.Module):
    """Encoder-decoder Transformer with embeddings, positional encodings and output projection.

    ``forward(src, tgt_in)`` returns next-token logits ``(B, T, tgt_vocab_size)`` for teacher
    forcing; :mod:`transformer_mt.inference.search` decodes with :meth:`encode` and :meth:`decode` over a
    key/value cache.
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        c = config
        src_token = TokenEmbedding(c.src_vocab_size, c.d_model, c.pad_id)
        tgt_token = (
            src_token
            if c.share_encoder_decoder_embeddings
            else TokenEmbedding(c.tgt_vocab_size, c.d_model, c.pad_id)
        )
        self.encoder = Encoder(
            c, TransformerEmbedding(src_token, c.d_model, c.max_len, c.dropout, c.positional)
        )
        self.decoder = Decoder(
            c, TransformerEmbedding(tgt_token, c.d_model, c.max_len, c.dropout, c.positional)
        )
        self.generator = nn.Linear(c.d_model, c.tgt_vocab_size, bias=False)
        self._init_weights()
        if c.tie_embeddings:
            # One Parameter object, not a copy: gradients from both uses add up in it.
            self.generator.weight = tgt_token.weight

    def _init_weights(self) -> None:
        # Xavier-uniform for every projection, as in the reference implementations; the
        # embeddings keep their N(0, d_model^-0.5) init from TokenEmbedding.
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.xavier_uniform_(module.weight)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)

    @property
    def pad_id(self) -> int:
        return self.config.pad_id

    def source_mask(self, src: Tensor) -> Tensor:
        """Padding mask of the source, ``(B, 1, 1, S)``, True = may attend."""
        return padding_mask(src, self.config.pad_id)

    def encode(self, src: Tensor) -> tuple[Tensor, Tensor]:
        """``src (B, S)`` -> ``(memory (B, S, d_model), src_mask (B, 1, 1, S))``."""
        src_mask = self.source_mask(src)
        return self.encoder(src, src_mask), src_mask

    def decode(
        self,
        tgt_in: Tensor,
        memory: Tensor,
        src_mask: Tensor | None,
        cache: list[tuple[KVCache, KVCache]] | None = None,
        offset: int = 0,
    ) -> Tensor:
        """Logits ``(B, T, tgt_vocab_size)`` for the target prefix ``tgt_in (B, T)``.

        The decoder's self-attention is causal, so target padding (always at the end) cannot
        influence the positions before it: no target padding mask is needed.
        """
        h = self.decoder(tgt_in, memory, src_mask, cache, offset)  # (B, T, d_model)
        return self.generator(h)  # (B, T, V)

    def forward(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        """Teacher forcing: ``src (B, S)``, ``tgt_in (B, T)`` -> logits ``(B, T, V)``."""
        memory, src_mask = self.encode(src)
        return self.decode(tgt_in, memory, src_mask)

    def new_cache(self) -> list[tuple[KVCache, KVCache]]:
        """Empty ``(self-attention, cross-attention)`` caches, one pair per decoder layer."""
        return [(KVCache(), KVCache()) for _ in self.decoder.layers]

    def store_attention_weights(self, enabled: bool = True) -> None:
        """Make every attention layer keep its last weights (explicit path), for plots."""
        for module in self.modules():
            if isinstance(module, MultiHeadAttention):
                module.store_weights = enabled
                if not enabled:
                    module.last_weights = None

    def num_parameters(self) -> int:
        """Trainable parameters, each shared tensor counted once."""
        return sum(p.numel() for p in self.parameters() if p.requires_grad)
