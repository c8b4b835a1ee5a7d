"""Our model as a standard Hugging Face class: which class, its config, weights, tokenizer.

Post-LN (the paper) -> ``MarianMTModel``; pre-LN -> ``PegasusForConditionalGeneration``. Their
position table orders the features differently from ours, so the export permutes the d_model
features (:mod:`transformer_mt.export.weights`; docs/export.md) and :func:`check_logits`
verifies every export. Options no standard class represents raise :class:`ExportError`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from transformer_mt.checkpoint import LoadedModel
from transformer_mt.data.collate import source_limit
from transformer_mt.data.tokenizer import BOS, EOS, PAD, UNK
from transformer_mt.errors import ExportError, require_export_extra
from transformer_mt.export.weights import convert_state_dict, feature_permutation
from transformer_mt.inference.search import SearchConfig
from transformer_mt.model.transformer import ModelConfig

#: Exported logits may differ from ours by float rounding only (positions are recomputed).
LOGITS_TOLERANCE = 1e-4


# ------------------------------------------------------------------ which standard class


@dataclass(frozen=True)
class Target:
    """The Hugging Face class that represents a model config exactly."""

    architecture: str  # e.g. "MarianMTModel"
    config_class: str  # e.g. "MarianConfig"
    model_type: str  # "marian" | "pegasus"

    @property
    def pre_ln(self) -> bool:
        return self.model_type == "pegasus"


MARIAN = Target("MarianMTModel", "MarianConfig", "marian")
PEGASUS = Target("PegasusForConditionalGeneration", "PegasusConfig", "pegasus")


def choose_target(config: ModelConfig, joint_vocab: bool = True) -> Target:
    """The standard class for ``config``, or :class:`ExportError` naming what blocks export."""
    blockers = []
    if config.positional != "sinusoidal":
        blockers.append(
            f"model.positional={config.positional} (Marian and Pegasus rebuild sinusoidal "
            "positions from the formula; learned positions have no place there)"
        )
    d_k = config.d_k if config.d_k is not None else config.d_model // config.n_heads
    d_v = config.d_v if config.d_v is not None else config.d_model // config.n_heads
    if d_k * config.n_heads != config.d_model or d_v * config.n_heads != config.d_model:
        blockers.append(
            f"model.d_k={config.d_k}, model.d_v={config.d_v} with n_heads={config.n_heads} "
            f"(standard classes need d_k = d_v = d_model / n_heads = "
            f"{config.d_model / config.n_heads:g})"
        )
    if config.activation not in ("relu", "gelu"):
        blockers.append(f"model.activation={config.activation}")
    if not joint_vocab or config.src_vocab_size != config.tgt_vocab_size:
        blockers.append(
            "separate source and target vocabularies (data.joint_vocab=false): a Hugging Face "
            "tokenizer directory holds one vocabulary"
        )
    if config.norm_first and not config.share_encoder_decoder_embeddings:
        blockers.append(
            "model.share_encoder_decoder_embeddings=false with model.norm_first=true "
            "(PegasusForConditionalGeneration has one embedding for both sides)"
        )
    if blockers:
        raise ExportError(
            "this model cannot be exported exactly to a standard Hugging Face class: "
            + "; ".join(blockers)
            + ". Retrain with the default for the named option(s) to export"
        )
    return PEGASUS if config.norm_first else MARIAN


def hf_config(config: ModelConfig, decoding: dict[str, Any] | None = None) -> Any:
    """The ``transformers`` config of the standard class for ``config``."""
    transformers = require_export_extra("transformers")
    target = choose_target(config)
    values = dict(
        vocab_size=config.src_vocab_size,
        max_position_embeddings=config.max_len,
        d_model=config.d_model,
        encoder_layers=config.n_encoder_layers,
        decoder_layers=config.n_decoder_layers,
        encoder_attention_heads=config.n_heads,
        decoder_attention_heads=config.n_heads,
        encoder_ffn_dim=config.d_ff,
        decoder_ffn_dim=config.d_ff,
        activation_function=config.activation,
        dropout=config.dropout,
        attention_dropout=config.attention_dropout,
        activation_dropout=config.ffn_dropout,
        scale_embedding=True,
        pad_token_id=config.pad_id,
        bos_token_id=1,
        eos_token_id=2,
        decoder_start_token_id=1,
        forced_eos_token_id=2,
        tie_word_embeddings=config.tie_embeddings,
        architectures=[target.architecture],
    )
    if target is MARIAN:
        values["share_encoder_decoder_embeddings"] = config.share_encoder_decoder_embeddings
        values["decoder_vocab_size"] = config.tgt_vocab_size
    return getattr(transformers, target.config_class)(**values)


def generation_config(config: ModelConfig, decoding: dict[str, Any] | None) -> Any:
    """``generate`` defaults that decode like our search.

    Beam size and the stop rule carry over exactly; ``gnmt`` length normalisation becomes the
    power rule with the same alpha (alike at 0 only), and the per-sentence length cap becomes
    one ``max_length`` (docs/export.md).
    """
    transformers = require_export_extra("transformers")
    search = SearchConfig.from_stored(decoding)
    beam = {}
    if search.beam_size > 1:  # generate refuses beam options with num_beams=1
        beam = {"early_stopping": True, "length_penalty": search.length_penalty}
    return transformers.GenerationConfig(
        decoder_start_token_id=1,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=config.pad_id,
        forced_eos_token_id=2,
        suppress_tokens=[config.pad_id, 1],
        num_beams=search.beam_size,
        max_length=config.max_len,
        **beam,
    )


def to_huggingface(loaded: LoadedModel) -> tuple[Any, Any]:
    """``(hf_model, hf_tokenizer)`` holding ``loaded``'s weights and vocabulary, in eval mode."""
    transformers = require_export_extra("transformers")
    target = choose_target(loaded.config, loaded.tokenizer.joint)
    hf = getattr(transformers, target.architecture)(hf_config(loaded.config, loaded.decoding))
    hf.generation_config = generation_config(loaded.config, loaded.decoding)
    converted = convert_state_dict(loaded.model.cpu(), pre_ln=target.pre_ln)
    expected = hf.state_dict()
    # Left as the class builds them: the position tables (rebuilt from the formula on every
    # load) and the zero output bias (ours has none).
    kept = {k for k in expected if "embed_positions" in k or k == "final_logits_bias"}
    missing = set(expected) - set(converted) - kept
    unexpected = set(converted) - set(expected)
    assert not missing and not unexpected, (sorted(missing)[:4], sorted(unexpected)[:4])
    state = {k: converted.get(k, expected[k]) for k in expected}
    for key in ("model.encoder.embed_positions.weight", "model.decoder.embed_positions.weight"):
        table = state[key]  # must be the sinusoid of our frequencies, in the standard order
        ours = loaded.model.encoder.embedding.position.pe[: table.size(0)].cpu()
        assert torch.allclose(ours[:, feature_permutation(ours.size(1))], table, atol=1e-4)
    hf.load_state_dict(state, strict=True)
    hf.eval()
    return hf, hf_tokenizer(loaded)


def hf_tokenizer(loaded: LoadedModel) -> Any:
    """A ``PreTrainedTokenizerFast`` over our (joint) vocabulary; appends ``<eos>`` itself."""
    transformers = require_export_extra("transformers")
    from tokenizers import Tokenizer as HFTokenizer

    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=HFTokenizer.from_str(loaded.tokenizer.src.to_str()),
        pad_token=PAD,
        bos_token=BOS,
        eos_token=EOS,
        unk_token=UNK,
        model_max_length=source_tokens(loaded),
        padding_side="right",
    )


def source_tokens(loaded: LoadedModel) -> int:
    """Source tokens ``<eos>`` included that our translator keeps: the tokenizer's limit."""
    data = loaded.data_config()
    limit = source_limit(None if data is None else data.max_len, loaded.config.max_len)
    return (limit if limit is not None else loaded.config.max_len - 1) + 1


@torch.no_grad()
def check_logits(loaded: LoadedModel, hf_model: Any, texts: Sequence[str]) -> float:
    """Max |logit difference| between ours and the exported model on ``texts`` (teacher forced).

    Raises:
        ExportError: the difference exceeds :data:`LOGITS_TOLERANCE`.
    """
    tok = loaded.tokenizer
    ids = tok.encode_batch(list(texts), add_special_tokens=True)
    width = max(len(r) for r in ids)
    src = torch.full((len(ids), width), tok.pad_id, dtype=torch.long)
    for i, row in enumerate(ids):
        src[i, : len(row)] = torch.tensor(row)
    tgt_in = torch.cat([torch.full((len(ids), 1), tok.bos_id), src[:, :-1]], dim=1)
    tgt_in = tgt_in.masked_fill(tgt_in == tok.eos_id, tok.pad_id)  # any prefix will do
    model = loaded.model.cpu().eval()
    ours = model(src, tgt_in)  # (B, T, V)
    theirs = hf_model(
        input_ids=src, attention_mask=src != tok.pad_id, decoder_input_ids=tgt_in
    ).logits
    diff = float((ours - theirs).abs().max())
    if not diff <= LOGITS_TOLERANCE:
        raise ExportError(
            f"the exported model's logits differ from ours by {diff:.3g} (> {LOGITS_TOLERANCE}); "
            "this is a bug in the exporter: please report it with the checkpoint's model config"
        )
    return diff
