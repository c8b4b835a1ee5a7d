"""The Transformer: shapes, causality, padding invariance, tying, gradients, parameter count."""

from __future__ import annotations

import pytest
import torch

from transformer_mt.model.attention import MultiHeadAttention, record_attention_weights
from transformer_mt.model.layers import DecoderLayer, EncoderLayer
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
        (
            {"d_model": 30, "n_heads": 4},
            r"d_model=30 is not divisible by model.n_heads=4; .*\(e.g. n_heads=3 or n_heads=5\)",
        ),
        ({"d_model": 30, "n_heads": 4, "d_k": 8}, r"d_model=30 is not divisible"),  # d_v derived
        ({"d_k": 0, "d_v": 8}, r"model.d_k must be >= 1 or null"),
        ({"activation": "tanh"}, r"unknown model.activation='tanh'; choose one of"),
        ({"positional": "rotary"}, r"unknown model.positional='rotary'; choose one of"),
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


def test_state_dict_keys_are_those_of_existing_checkpoints() -> None:
    # Checkpoints written before modules took their config whole must keep loading, and the
    # export to Hugging Face maps these names: they may not change.
    config = tiny_config(
        n_encoder_layers=1,
        n_decoder_layers=1,
        tie_embeddings=False,
        share_encoder_decoder_embeddings=False,
        positional="learned",
    )
    attention = [f"{p}.{w}" for p in ("q_proj", "k_proj", "v_proj", "out_proj") for w in "wb"]
    ffn = [f"feed_forward.linear{i}.{w}" for i in (1, 2) for w in "wb"]

    def norms(n: int) -> list[str]:
        return [f"sublayer{i}.norm.{w}" for i in range(1, n + 1) for w in "wb"]

    def block(prefix: str, parts: list[str]) -> list[str]:
        return [f"{prefix}.{part}" for part in parts]

    expected = [
        "encoder.embedding.token.w",
        "encoder.embedding.position.embedding.w",
        *block("encoder.layers.0.self_attn", attention),
        *block("encoder.layers.0", ffn + norms(2)),
        "decoder.embedding.token.w",
        "decoder.embedding.position.embedding.w",
        *block("decoder.layers.0.self_attn", attention),
        *block("decoder.layers.0.cross_attn", attention),
        *block("decoder.layers.0", ffn + norms(3)),
        "generator.w",
    ]
    expected = [k.removesuffix(".w") + ".weight" if k.endswith(".w") else k for k in expected]
    expected = [k.removesuffix(".b") + ".bias" if k.endswith(".b") else k for k in expected]
    assert list(Transformer(config).state_dict()) == expected


def test_layers_are_built_from_the_config_whole() -> None:
    config = tiny_config(d_k=6, d_v=5, d_ff=48, attention_dropout=0.2, fused_attention=False)
    encoder_layer, decoder_layer = EncoderLayer(config), DecoderLayer(config)
    for mha in (encoder_layer.self_attn, decoder_layer.self_attn, decoder_layer.cross_attn):
        assert (mha.n_heads, mha.d_k, mha.d_v, mha.dropout, mha.fused) == (4, 6, 5, 0.2, False)
        assert mha.v_proj.out_features == 4 * 5
    assert decoder_layer.feed_forward.linear1.out_features == 48
    model = Transformer(config)
    attention = [m for m in model.modules() if isinstance(m, MultiHeadAttention)]
    assert len(attention) == 2 + 2 * 2  # 2 encoder layers, 2 decoder layers
    assert all(m.d_k == 6 and m.d_v == 5 for m in attention)


def test_record_attention_weights_of_the_whole_model() -> None:
    model = Transformer(tiny_config()).eval()
    src, tgt = random_batch()  # row 1 ends with two padding tokens
    with record_attention_weights(model) as records:
        logits = model(src, tgt)
    torch.testing.assert_close(logits, model(src, tgt), rtol=0, atol=0)
    kinds = ("encoder.layers.{}.self_attn", "decoder.layers.{}.self_attn")
    names = [k.format(i) for k in kinds for i in range(2)]
    names += [f"decoder.layers.{i}.cross_attn" for i in range(2)]
    assert sorted(records) == sorted(names)
    assert all(len(calls) == 1 for calls in records.values())
    B, S, T, H = 3, 7, 6, 4
    assert records["encoder.layers.1.self_attn"][0].shape == (B, H, S, S)
    decoder_self = records["decoder.layers.0.self_attn"][0]
    cross = records["decoder.layers.1.cross_attn"][0]
    assert decoder_self.shape == (B, H, T, T) and cross.shape == (B, H, T, S)
    assert float(decoder_self.triu(1).abs().sum()) == 0.0  # no weight on the future
    assert float(cross[1, :, :, S - 2 :].abs().sum()) == 0.0  # none on source padding
    torch.testing.assert_close(cross.sum(-1), torch.ones(B, H, T))


def test_activation_dropout_is_its_own_knob() -> None:
    """The feed-forward hidden units drop at ``activation_dropout``; the residual and
    embedding dropout stay at ``dropout``; ``None`` keeps the one-dropout model."""
    from transformer_mt.model.dropout import Dropout
    from transformer_mt.model.layers import PositionwiseFeedForward

    def rates(model: Transformer) -> tuple[set[float], set[float]]:
        ffn = {m.dropout.p for m in model.modules() if isinstance(m, PositionwiseFeedForward)}
        other = {
            m.p
            for name, m in model.named_modules()
            if isinstance(m, Dropout) and "feed_forward" not in name
        }
        return ffn, other

    assert rates(Transformer(tiny_config(dropout=0.1))) == ({0.1}, {0.1})
    assert rates(Transformer(tiny_config(dropout=0.3, activation_dropout=0.0))) == ({0.0}, {0.3})
    ffn = PositionwiseFeedForward(tiny_config(dropout=0.0, activation_dropout=0.5)).train()
    x = torch.randn(2, 5, ffn.linear1.in_features)
    assert not torch.allclose(ffn(x), ffn(x))
    with pytest.raises(ValueError, match=r"model.activation_dropout must be in \[0, 1\)"):
        tiny_config(activation_dropout=1.5)
