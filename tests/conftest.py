"""Shared fixtures: tiny dimensions so every test runs in milliseconds on a CPU."""

from __future__ import annotations

import pytest
import torch

from transformer_mt.model import ModelConfig, Transformer

PAD, BOS, EOS = 0, 1, 2


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


def tiny_config(**overrides) -> ModelConfig:
    values = dict(
        src_vocab_size=40,
        tgt_vocab_size=40,
        pad_id=PAD,
        d_model=32,
        n_heads=4,
        d_ff=64,
        n_encoder_layers=2,
        n_decoder_layers=2,
        dropout=0.0,
        max_len=64,
    )
    values.update(overrides)
    return ModelConfig(**values)


@pytest.fixture
def tiny_model() -> Transformer:
    return Transformer(tiny_config()).eval()


def random_batch(batch: int = 3, src_len: int = 7, tgt_len: int = 6, vocab: int = 40):
    """Token ids avoiding the special ids 0..3, with some padding at the ends of rows."""
    src = torch.randint(4, vocab, (batch, src_len))
    tgt = torch.randint(4, vocab, (batch, tgt_len))
    if batch > 1:
        src[1, src_len - 2 :] = PAD
        tgt[1, tgt_len - 2 :] = PAD
    return src, tgt
