"""The model's configuration: one typed dataclass, validated once, that every module takes whole.

:class:`ModelConfig` holds every size and switch of the Transformer. Its ``__post_init__`` is
the one place the values are checked (each error names the value and the fix); the modules
built from it trust it. :class:`AttentionConfig` is the slice one attention layer needs, with
the per-head sizes resolved (``ModelConfig.attention``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

#: Names accepted by ``ModelConfig.activation`` and ``ModelConfig.positional``.
ACTIVATIONS = ("gelu", "relu")
POSITIONAL_ENCODINGS = ("learned", "sinusoidal")


@dataclass(frozen=True)
class AttentionConfig:
    """The sizes and switches of one multi-head attention layer.

    Built from a validated model config by :attr:`ModelConfig.attention`; build it directly
    only for attention on its own (benchmarks, tests), where the per-head sizes are explicit.

    Attributes:
        d_model: model width (input and output size).
        n_heads: number of heads h.
        d_k, d_v: per-head query/key and value sizes.
        dropout: dropout on the attention weights, applied only in training.
        fused: use ``F.scaled_dot_product_attention`` (True) or the explicit paper math (False).
        bias: whether the four projections have biases.
    """

    d_model: int
    n_heads: int
    d_k: int
    d_v: int
    dropout: float = 0.0
    fused: bool = True
    bias: bool = True


@dataclass
class ModelConfig:
    """Every size and switch of the model, in the paper's vocabulary.

    ``src_vocab_size``, ``tgt_vocab_size`` and ``pad_id`` come from the tokenizer (never typed
    twice). Defaults are the paper's base model (Table 3).

    Attributes:
        d_k, d_v: per-head sizes; ``None`` (the default) = ``d_model // n_heads``, which then
            must divide evenly.
        attention_dropout: dropout on the attention weights (``dropout`` is the residual,
            embedding and feed-forward dropout).
        activation_dropout: dropout on the feed-forward layer's hidden activations
            (fairseq's ``--activation-dropout``); ``None`` = ``dropout``.
        activation: feed-forward non-linearity, one of :data:`ACTIVATIONS`.
        norm_first: False = post-LN (the paper), True = pre-LN with a final LayerNorm.
        tie_embeddings: share the decoder's input embedding with the pre-softmax linear layer.
        share_encoder_decoder_embeddings: one embedding matrix for source and target
            (needs a joint vocabulary, i.e. equal vocabulary sizes). With both switches on,
            the three matrices of section 3.4 are one tensor.
        max_len: positions the positional encoding covers.
        positional: one of :data:`POSITIONAL_ENCODINGS`.
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
    activation_dropout: float | None = None
    activation: str = "relu"
    norm_first: bool = False
    tie_embeddings: bool = True
    share_encoder_decoder_embeddings: bool = True
    max_len: int = 1024
    positional: str = "sinusoidal"
    fused_attention: bool = True

    def __post_init__(self) -> None:
        positive = (
            "src_vocab_size",
            "tgt_vocab_size",
            "d_model",
            "n_heads",
            "d_ff",
            "n_encoder_layers",
            "n_decoder_layers",
            "max_len",
        )
        for name in positive:
            if getattr(self, name) < 1:
                raise ValueError(f"model.{name} must be >= 1, got {getattr(self, name)}")
        for name in ("d_k", "d_v"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(
                    f"model.{name} must be >= 1 or null (= d_model // n_heads), got {value}"
                )
        if (self.d_k is None or self.d_v is None) and self.d_model % self.n_heads != 0:
            raise ValueError(
                f"model.d_model={self.d_model} is not divisible by model.n_heads={self.n_heads}; "
                f"pick n_heads that divides d_model (e.g. {_divisor_hint(self)}), or set "
                "model.d_k and model.d_v explicitly"
            )
        for name in ("dropout", "attention_dropout", "activation_dropout"):
            value = getattr(self, name)
            if value is not None and not 0.0 <= value < 1.0:
                raise ValueError(f"model.{name} must be in [0, 1), got {value}")
        if self.activation not in ACTIVATIONS:
            raise ValueError(
                f"unknown model.activation={self.activation!r}; choose one of {list(ACTIVATIONS)}"
            )
        if self.positional not in POSITIONAL_ENCODINGS:
            raise ValueError(
                f"unknown model.positional={self.positional!r}; "
                f"choose one of {list(POSITIONAL_ENCODINGS)}"
            )
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

    @property
    def ffn_dropout(self) -> float:
        """The feed-forward hidden units' dropout: ``activation_dropout``, else ``dropout``."""
        return self.dropout if self.activation_dropout is None else self.activation_dropout

    @property
    def attention(self) -> AttentionConfig:
        """The configuration of every attention layer, per-head sizes resolved."""
        d_head = self.d_model // self.n_heads
        return AttentionConfig(
            d_model=self.d_model,
            n_heads=self.n_heads,
            d_k=self.d_k if self.d_k is not None else d_head,
            d_v=self.d_v if self.d_v is not None else d_head,
            dropout=self.attention_dropout,
            fused=self.fused_attention,
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


def _divisor_hint(config: ModelConfig) -> str:
    """The one or two head counts nearest ``n_heads`` that divide ``d_model``."""
    divisors = [h for h in range(1, min(config.d_model, 64) + 1) if config.d_model % h == 0]
    nearest = sorted(divisors, key=lambda h: abs(h - config.n_heads))[:2]
    return " or ".join(f"n_heads={h}" for h in sorted(nearest))
