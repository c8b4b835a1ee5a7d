"""The Transformer: shapes, causality, padding invariance, tying, gradients, parameter count."""

from __future__ import annotations

import pytest
import torch

from transformer_mt.model.transformer import ModelConfig, Transformer

from conftest import PAD, random_batch, tiny_config


@pytest.mark.parametrize("norm_first", [False, True])
def test_forward_shape(norm_first: bool) -> None:
    model = Transformer(tiny_config(norm_first=norm_first)).eval()
    src, tgt = random_batch()
    assert model(src, tgt).shape == (3, 6, 40)


@pytest.mark.parametrize("fused", [True, False])
def test_causality_future_tokens_do_not_change_earlier_logits(fused: bool) -> None:
    model = Transformer(tiny_config(fused_attention=fused)).eval()
    src, tgt = random_batch()
    logits = model(src, tgt)
    changed = tgt.clone()
    changed[:, 3:] = torch.randint(4, 40, changed[:, 3:].shape)
    logits2 = model(src, changed)
    torch.testing.assert_close(logits[:, :3], logits2[:, :3], atol=1e-5, rtol=1e-5)
    assert not torch.allclose(logits[:, 3:], logits2[:, 3:])


@pytest.mark.parametrize("fused", [True, False])
def test_extra_padding_changes_nothing(fused: bool) -> None:
    model = Transformer(tiny_config(fused_attention=fused)).eval()
    src, tgt = random_batch()
    logits = model(src, tgt)
    src_padded = torch.cat([src, torch.full((3, 5), PAD)], dim=1)
    tgt_padded = torch.cat([tgt, torch.full((3, 4), PAD)], dim=1)
    logits_padded = model(src_padded, tgt_padded)
    torch.testing.assert_close(logits_padded[:, :6], logits, atol=1e-5, rtol=1e-5)


def test_fully_padded_source_row_gives_no_nan() -> None:
    model = Transformer(tiny_config()).eval()
    src, tgt = random_batch()
    src[2] = PAD
    for fused in (True, False):
        model.config.fused_attention = fused
        for m in model.modules():
            if hasattr(m, "fused"):
                m.fused = fused
        assert torch.isfinite(model(src, tgt)).all()


def test_explicit_and_fused_models_agree() -> None:
    fused = Transformer(tiny_config(fused_attention=True)).eval()
    explicit = Transformer(tiny_config(fused_attention=False)).eval()
    explicit.load_state_dict(fused.state_dict())
    src, tgt = random_batch()
    torch.testing.assert_close(fused(src, tgt), explicit(src, tgt), atol=1e-5, rtol=1e-5)


def test_gradients_reach_every_parameter() -> None:
    model = Transformer(tiny_config(norm_first=True, dropout=0.1)).train()
    src, tgt = random_batch()
    logits = model(src, tgt[:, :-1])
    loss = torch.nn.functional.cross_entropy(
        logits.reshape(-1, 40), tgt[:, 1:].reshape(-1), ignore_index=PAD
    )
    loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is not None, f"no gradient for {name}"
        assert torch.isfinite(p.grad).all(), name
        assert p.grad.abs().sum() > 0, f"zero gradient for {name}"


def test_tied_weights_are_one_tensor() -> None:
    model = Transformer(tiny_config(tie_embeddings=True, share_encoder_decoder_embeddings=True))
    emb = model.encoder.embedding.token.weight
    assert model.decoder.embedding.token.weight is emb
    assert model.generator.weight is emb
    # Counted once: vocab * d_model appears a single time in the total.
    untied = Transformer(tiny_config(tie_embeddings=False, share_encoder_decoder_embeddings=False))
    assert untied.num_parameters() - model.num_parameters() == 2 * 40 * 32


def test_untied_generator_is_separate() -> None:
    model = Transformer(tiny_config(tie_embeddings=False, share_encoder_decoder_embeddings=False))
    assert model.generator.weight is not model.decoder.embedding.token.weight
    assert model.decoder.embedding.token.weight is not model.encoder.embedding.token.weight


def test_separate_vocabularies() -> None:
    cfg = tiny_config(tgt_vocab_size=50, share_encoder_decoder_embeddings=False)
    model = Transformer(cfg).eval()
    src, tgt = random_batch()
    assert model(src, tgt).shape == (3, 6, 50)


def test_paper_base_parameter_count() -> None:
    # Paper Table 3, base: d_model 512, 8 heads, d_ff 2048, 6+6 layers, shared 37k vocab: ~65M.
    model = Transformer(ModelConfig(src_vocab_size=37000, tgt_vocab_size=37000))
    assert model.num_parameters() == 63_082_496


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"d_model": 30, "n_heads": 4}, r"d_model=30 is not divisible by model.n_heads=4"),
        ({"dropout": 1.0}, r"dropout must be in \[0, 1\), got 1.0"),
        ({"dropout": -0.1}, r"dropout must be in \[0, 1\)"),
        ({"tgt_vocab_size": 50}, r"src_vocab_size=40 != tgt_vocab_size=50"),
        ({"n_encoder_layers": 0}, r"n_encoder_layers must be >= 1"),
    ],
)
def test_config_errors_name_values(overrides: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        tiny_config(**overrides)


def test_config_round_trip_plain_types() -> None:
    cfg = tiny_config(norm_first=True)
    values = cfg.to_dict()
    assert all(isinstance(v, (int, float, str, bool, type(None))) for v in values.values())
    assert ModelConfig.from_dict(values) == cfg
    with pytest.raises(ValueError, match="unknown model config keys"):
        ModelConfig.from_dict({**values, "d_modle": 3})


def test_learned_positions_and_max_len() -> None:
    model = Transformer(tiny_config(positional="learned", max_len=8)).eval()
    src, tgt = random_batch()
    assert model(src, tgt).shape == (3, 6, 40)
    with pytest.raises(ValueError, match="exceeds max_len=8"):
        model(torch.randint(4, 40, (1, 9)), tgt)
