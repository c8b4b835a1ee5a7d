"""The Transformer (Figure 1 of the paper): Encoder, Decoder and the model that joins them.

Every module is built from one :class:`~transformer_mt.model.config.ModelConfig` (re-exported
here), which validated the sizes once. This wing imports only torch: it works without
Lightning or Hydra.
"""

from __future__ import annotations

from torch import Tensor, nn

from transformer_mt.model.attention import padding_mask
from transformer_mt.model.config import ModelConfig
from transformer_mt.model.embedding import TokenEmbedding, TransformerEmbedding
from transformer_mt.model.kv_cache import KVCache
from transformer_mt.model.layers import DecoderLayer, EncoderLayer

__all__ = ["Decoder", "Encoder", "ModelConfig", "Transformer"]


class Encoder(nn.Module):
    """A stack of N :class:`EncoderLayer` (plus a final LayerNorm in pre-LN mode)."""

    def __init__(self, config: ModelConfig, embedding: TransformerEmbedding) -> None:
        super().__init__()
        self.embedding = embedding
        self.layers = nn.ModuleList(EncoderLayer(config) for _ in range(config.n_encoder_layers))
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
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.n_decoder_layers))
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
    forcing; :mod:`transformer_mt.inference.search` decodes with :meth:`encode` and
    :meth:`decode` over a key/value cache (:meth:`new_cache`).
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
        self.encoder = Encoder(c, TransformerEmbedding(src_token, c))
        self.decoder = Decoder(c, TransformerEmbedding(tgt_token, c))
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

    def num_parameters(self) -> int:
        """Trainable parameters, each shared tensor counted once."""
        return sum(p.numel() for p in self.parameters() if p.requires_grad)
