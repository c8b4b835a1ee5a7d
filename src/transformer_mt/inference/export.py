"""Ship a trained model: a Hugging Face model directory, and CTranslate2 from it.

``transformer-mt-export --ckpt run/checkpoints/best.ckpt --out exported/`` writes a directory
that ``AutoModelForSeq2SeqLM.from_pretrained`` and ``AutoTokenizer.from_pretrained`` load and
``pipeline("translation", model=...)`` runs: ``config.json``, ``model.safetensors``,
``generation_config.json``, the tokenizer (``tokenizer.json`` + ``tokenizer_config.json``) and a
``README.md`` model card. ``--format ctranslate2 [--quantization int8]`` converts that
directory with CTranslate2's own Transformers converter, for fast CPU decoding.

Which standard class holds our model exactly:

* post-LN (``norm_first=false``, the paper) -> ``MarianMTModel``;
* pre-LN (``norm_first=true``) -> ``PegasusForConditionalGeneration`` (pre-LN layers and a final
  LayerNorm on both stacks, as ours).

Both scale token embeddings by sqrt(d_model), add sinusoidal positions of our frequencies, and
have biases on every attention projection. Their position table puts the sines in the first
half of the features and the cosines in the second, where ours interleaves them; and they
rebuild the table from the formula on load (it is not saved). So instead of storing our table,
the export renames the model's d_model features by the fixed permutation that turns our table
into theirs: every weight that reads the residual stream has its input columns permuted, every
weight that writes it has its rows permuted, and LayerNorm (which treats features alike) has its
gain and bias permuted. The network computes the same function in the new coordinates, which
:func:`check_logits` verifies on every export.

``<bos>`` is the decoder start token (``decoder_start_token_id``); the tokenizer's post-processor
appends ``<eos>`` to each source, as training did. Options no standard class represents (learned
positions, per-head sizes that do not multiply to d_model, separate vocabularies) raise
:class:`ExportError` naming the option.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import shutil
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from transformer_mt.checkpoint import CheckpointError, LoadedModel, load_checkpoint, load_model
from transformer_mt.cli import UserError
from transformer_mt.data.tokenizer import BOS, EOS, PAD, UNK
from transformer_mt.files import write_text_atomic
from transformer_mt.inference.search import SearchConfig
from transformer_mt.model.transformer import ModelConfig, Transformer

log = logging.getLogger(__name__)

#: What ``pip install`` needs for this module, named in every "missing package" error.
EXTRA_HINT = "install the export extra: pip install 'transformer-mt[export]'"
FORMATS = ("huggingface", "ctranslate2")
QUANTIZATIONS = ("float32", "int8", "int8_float32", "int16", "float16", "bfloat16")
#: Exported logits may differ from ours by float rounding only (positions are recomputed).
LOGITS_TOLERANCE = 1e-4


class ExportError(UserError):
    """The model cannot be exported as asked; the message names the option and the fix."""


def _require(module: str) -> Any:
    """Import an optional dependency of the ``export`` extra, or fail naming the extra."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise ExportError(f"{module} is not installed ({err}); {EXTRA_HINT}") from None


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
    transformers = _require("transformers")
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
        activation_dropout=config.dropout,  # ours drops the FFN's hidden units at `dropout`
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

    Beam size and the "stop at K finished hypotheses" rule carry over exactly; ``<pad>`` and
    ``<bos>`` are never generated (as in our search), and ``<eos>`` is forced at the length cap.
    Two conventions differ and cannot be expressed: our length penalty is GNMT's
    ``((5 + |Y|) / 6) ** alpha`` where ``generate`` divides by ``|Y| ** length_penalty`` (the
    same value of alpha is written; with alpha = 0 both rank by log-probability), and our
    length cap is per sentence (``max_len_a * source length + max_len_b``) where ``generate``
    has one cap (``max_length``, here the model's positional limit).
    """
    transformers = _require("transformers")
    search = _search_config(decoding)
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


def _search_config(decoding: dict[str, Any] | None) -> SearchConfig:
    known = set(SearchConfig.__dataclass_fields__)
    return SearchConfig(**{k: v for k, v in (decoding or {}).items() if k in known})


# ------------------------------------------------------------------ weights


def feature_permutation(d_model: int) -> torch.Tensor:
    """Index ``p`` with ``ours[:, p] == standard`` for the sinusoidal tables.

    Ours: column 2i = sin(pos * w_i), 2i+1 = cos(pos * w_i). Marian/Pegasus: the sines of all
    frequencies, then the cosines.
    """
    return torch.cat([torch.arange(0, d_model, 2), torch.arange(1, d_model, 2)])


def convert_state_dict(model: Transformer, target: Target) -> dict[str, torch.Tensor]:
    """Our parameters under the standard class's names, in the permuted feature order."""
    config = model.config
    p = feature_permutation(config.d_model)
    state = {k: v.detach().float() for k, v in model.state_dict().items()}

    def reads(w: torch.Tensor) -> torch.Tensor:  # (out, d_model): permute input columns
        return w[:, p].contiguous()

    def writes(w: torch.Tensor) -> torch.Tensor:  # (d_model, ...) or (d_model,): permute rows
        return w[p].contiguous()

    out: dict[str, torch.Tensor] = {}

    def linear(ours: str, theirs: str, read: bool, write: bool) -> None:
        w, b = state[f"{ours}.weight"], state.get(f"{ours}.bias")
        if read:
            w = reads(w)
        if write:
            w = writes(w)
            b = writes(b) if b is not None else None
        out[f"{theirs}.weight"] = w
        if b is not None:
            out[f"{theirs}.bias"] = b.contiguous()

    def norm(ours: str, theirs: str) -> None:
        out[f"{theirs}.weight"] = writes(state[f"{ours}.weight"])
        out[f"{theirs}.bias"] = writes(state[f"{ours}.bias"])

    def attention(ours: str, theirs: str) -> None:
        for proj in ("q_proj", "k_proj", "v_proj"):
            linear(f"{ours}.{proj}", f"{theirs}.{proj}", read=True, write=False)
        linear(f"{ours}.out_proj", f"{theirs}.out_proj", read=False, write=True)

    def ffn(ours: str, theirs: str) -> None:
        linear(f"{ours}.feed_forward.linear1", f"{theirs}.fc1", read=True, write=False)
        linear(f"{ours}.feed_forward.linear2", f"{theirs}.fc2", read=False, write=True)

    src_emb = reads(state["encoder.embedding.token.weight"])
    tgt_emb = reads(state["decoder.embedding.token.weight"])
    out["model.encoder.embed_tokens.weight"] = src_emb
    out["model.decoder.embed_tokens.weight"] = tgt_emb
    if config.share_encoder_decoder_embeddings:
        out["model.shared.weight"] = src_emb
    out["lm_head.weight"] = reads(state["generator.weight"])
    for i in range(config.n_encoder_layers):
        ours, theirs = f"encoder.layers.{i}", f"model.encoder.layers.{i}"
        attention(f"{ours}.self_attn", f"{theirs}.self_attn")
        norm(f"{ours}.sublayer1.norm", f"{theirs}.self_attn_layer_norm")
        ffn(ours, theirs)
        norm(f"{ours}.sublayer2.norm", f"{theirs}.final_layer_norm")
    for i in range(config.n_decoder_layers):
        ours, theirs = f"decoder.layers.{i}", f"model.decoder.layers.{i}"
        attention(f"{ours}.self_attn", f"{theirs}.self_attn")
        norm(f"{ours}.sublayer1.norm", f"{theirs}.self_attn_layer_norm")
        attention(f"{ours}.cross_attn", f"{theirs}.encoder_attn")
        norm(f"{ours}.sublayer2.norm", f"{theirs}.encoder_attn_layer_norm")
        ffn(ours, theirs)
        norm(f"{ours}.sublayer3.norm", f"{theirs}.final_layer_norm")
    if target.pre_ln:
        norm("encoder.norm", "model.encoder.layer_norm")
        norm("decoder.norm", "model.decoder.layer_norm")
    return out


def to_huggingface(loaded: LoadedModel) -> tuple[Any, Any]:
    """``(hf_model, hf_tokenizer)`` holding ``loaded``'s weights and vocabulary, in eval mode."""
    transformers = _require("transformers")
    target = choose_target(loaded.config, loaded.tokenizer.joint)
    hf = getattr(transformers, target.architecture)(hf_config(loaded.config, loaded.decoding))
    hf.generation_config = generation_config(loaded.config, loaded.decoding)
    converted = convert_state_dict(loaded.model.cpu(), target)
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
    transformers = _require("transformers")
    from tokenizers import Tokenizer as HFTokenizer

    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=HFTokenizer.from_str(loaded.tokenizer.src.to_str()),
        pad_token=PAD,
        bos_token=BOS,
        eos_token=EOS,
        unk_token=UNK,
        model_max_length=loaded.config.max_len - 1,  # room for the appended <eos>
        padding_side="right",
    )


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


# ------------------------------------------------------------------ files


def export_huggingface(
    ckpt: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    results: str | os.PathLike[str] | None = None,
    force: bool = False,
) -> Path:
    """Write the Hugging Face model directory for checkpoint ``ckpt``; return ``out_dir``.

    The directory is built next to ``out_dir`` and renamed into place when complete, so an
    interrupted export never leaves a half-written model behind.
    """
    out_dir = Path(out_dir)
    _check_out_dir(out_dir, force)
    results_data = _read_results(results) if results is not None else None
    loaded = load_model(ckpt)
    checkpoint = load_checkpoint(ckpt)
    hf, tokenizer = to_huggingface(loaded)
    sample = _sample_texts(loaded)
    diff = check_logits(loaded, hf, sample)
    log.info("exported logits match ours to %.2g on %d sentences", diff, len(sample))
    with _staging(out_dir, force) as tmp:
        hf.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        _portable_tokenizer_class(tmp / "tokenizer_config.json")
        loaded.tokenizer.save(tmp / "transformer_mt")  # our metadata, languages included
        card = model_card(loaded, checkpoint, hf, results_data, diff)
        write_text_atomic(tmp / "README.md", card)
        if results_data is not None:
            write_text_atomic(tmp / "results.json", json.dumps(results_data, indent=2) + "\n")
    log.info("wrote %s (%s)", out_dir, type(hf).__name__)
    return out_dir


def export_ctranslate2(
    hf_dir: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    quantization: str | None = None,
    force: bool = False,
) -> Path:
    """Convert an exported Hugging Face directory with CTranslate2's Transformers converter.

    The converter's stock Marian loader assumes the Marian convention of starting the decoder
    from a zero embedding and drops the last vocabulary entry (Marian's appended pad); ours
    starts from ``<bos>`` and has no such entry. So the conversion runs with the converter's
    generic encoder-decoder loader (its ``BartLoader``, told post- or pre-LN and no embedding
    LayerNorm), whose ``decoder_start_token`` comes from the model config: ``<bos>``.
    """
    converters = _require("ctranslate2.converters")
    from ctranslate2.converters import transformers as ct2_transformers

    if quantization is not None and quantization not in QUANTIZATIONS:
        raise ExportError(
            f"unknown quantization {quantization!r}; choose one of {', '.join(QUANTIZATIONS)}"
        )
    hf_dir, out_dir = Path(hf_dir), Path(out_dir)
    config = json.loads((hf_dir / "config.json").read_text(encoding="utf-8"))
    model_type = config.get("model_type")
    if model_type not in ("marian", "pegasus"):
        raise ExportError(
            f"{hf_dir} holds a {model_type!r} model, not one exported by transformer-mt-export; "
            "export the checkpoint first (transformer-mt-export --ckpt ... --out DIR)"
        )
    _check_out_dir(out_dir, force)

    class Loader(ct2_transformers.BartLoader):  # the converter's own encoder-decoder loader
        @property
        def architecture_name(self) -> str:
            return str(config["architectures"][0])

        def get_model_spec(self, model: Any) -> Any:
            model.config.normalize_before = model_type == "pegasus"
            model.config.normalize_embedding = False  # no LayerNorm on the embeddings
            return super().get_model_spec(model)

    config_class = "MarianConfig" if model_type == "marian" else "PegasusConfig"
    with _loader_for(ct2_transformers, config_class, Loader()), _staging(out_dir, force) as tmp:
        converter = converters.TransformersConverter(str(hf_dir))
        converter.convert(str(tmp), quantization=quantization, force=True)
        for name in ("generation_config.json", "README.md"):
            if (hf_dir / name).is_file():
                shutil.copy2(hf_dir / name, tmp / name)
        if (hf_dir / "transformer_mt").is_dir():
            shutil.copytree(hf_dir / "transformer_mt", tmp / "transformer_mt")
    log.info("wrote %s (CTranslate2, %s)", out_dir, quantization or "float32")
    return out_dir


@contextlib.contextmanager
def _loader_for(module: Any, config_class: str, loader: Any) -> Iterator[None]:
    """Use ``loader`` for ``config_class`` inside the block; restore the registered one."""
    registry = module._MODEL_LOADERS
    previous = registry.get(config_class)
    registry[config_class] = loader
    try:
        yield
    finally:
        if previous is None:
            registry.pop(config_class, None)
        else:
            registry[config_class] = previous


@contextlib.contextmanager
def _staging(out_dir: Path, force: bool) -> Iterator[Path]:
    """A fresh sibling directory that replaces ``out_dir`` when the block succeeds."""
    tmp = out_dir.with_name(f".{out_dir.name}.partial")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if out_dir.exists():
        old = out_dir.with_name(f".{out_dir.name}.old")
        shutil.rmtree(old, ignore_errors=True)
        out_dir.rename(old)
        tmp.rename(out_dir)
        shutil.rmtree(old, ignore_errors=True)
    else:
        tmp.rename(out_dir)


def _portable_tokenizer_class(path: Path) -> None:
    """Name the class every ``transformers`` release knows (v5 writes its new backend's name)."""
    config = json.loads(path.read_text(encoding="utf-8"))
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    write_text_atomic(path, json.dumps(config, indent=2, ensure_ascii=False) + "\n")


def _check_out_dir(out_dir: Path, force: bool) -> None:
    if out_dir.exists() and not out_dir.is_dir():
        raise ExportError(f"--out {out_dir} is a file; pass a directory path")
    if out_dir.is_dir() and any(out_dir.iterdir()) and not force:
        raise ExportError(
            f"--out {out_dir} exists and is not empty; pass --force to replace it, or choose "
            "another directory"
        )


def _read_results(path: str | os.PathLike[str]) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise ExportError(
            f"--results {path} does not exist; pass the results.json that evaluate.py wrote"
        )
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise ExportError(f"--results {path} is not valid JSON ({err})") from None
    if not isinstance(data, dict):
        raise ExportError(f"--results {path} is not a JSON object written by evaluate.py")
    return data


def _sample_texts(loaded: LoadedModel) -> list[str]:
    """A few strings of mixed length for the logits check (any text will do)."""
    base = "A man in an orange hat looks at something 12 34."
    return [base[:8], base, " ".join([base] * 3)[: 4 * loaded.config.max_len // 5]]


def _training_time(checkpoint: dict[str, Any]) -> str | None:
    for key, state in (checkpoint.get("callbacks") or {}).items():
        if str(key).startswith("Timer") and isinstance(state, dict):
            elapsed = (state.get("time_elapsed") or {}).get("train")
            if elapsed:
                return f"{float(elapsed) / 60:.1f} min"
    return None


def model_card(
    loaded: LoadedModel,
    checkpoint: dict[str, Any],
    hf_model: Any,
    results: dict[str, Any] | None,
    logits_diff: float,
) -> str:
    """README.md of the exported directory: what the model is, how it was made, how it scores."""
    c = loaded.config
    src, tgt = loaded.src_lang or "?", loaded.tgt_lang or "?"
    data = loaded.data or {}
    dataset = data.get("name") or data.get("source") or data.get("dataset") or "unknown"
    search = _search_config(loaded.decoding)
    n_params = sum(p.numel() for p in hf_model.parameters())
    lines = [
        "---",
        f"language: [{src}, {tgt}]",
        "library_name: transformers",
        "pipeline_tag: translation",
        "tags: [translation, transformer-mt]",
        "---",
        "",
        f"# transformer-mt {src}->{tgt}",
        "",
        "A Transformer (Vaswani et al., 2017) trained from scratch with "
        "[transformer-mt](https://github.com/) and exported as "
        f"`{type(hf_model).__name__}` (exactly the same function: logits match the original "
        f"to {logits_diff:.1e}).",
        "",
        "| | |",
        "|---|---|",
        f"| direction | {src} -> {tgt} |",
        f"| training data | {dataset} |",
        f"| architecture | {'pre-LN' if c.norm_first else 'post-LN'}, d_model {c.d_model}, "
        f"{c.n_heads} heads, d_ff {c.d_ff}, {c.n_encoder_layers}+{c.n_decoder_layers} layers, "
        f"{c.activation} |",
        f"| parameters | {n_params / 1e6:.2f} M |",
        f"| vocabulary | {c.src_vocab_size} byte-level BPE tokens, joint |",
        f"| training | step {checkpoint.get('global_step')}, epoch {checkpoint.get('epoch')}"
        + (f", {t}" if (t := _training_time(checkpoint)) else "")
        + " |",
        f"| decoding | beam {search.beam_size}, length penalty {search.length_penalty} |",
    ]
    if results:
        metrics = results.get("metrics") or {}
        signature = results.get("signature") or {}
        split = (results.get("data") or {}).get("split", "test")
        for name in ("bleu", "chrf"):
            if name in metrics:
                sig = signature.get(name, "")
                lines.append(f"| {name} ({split}) | {metrics[name]:.2f} `{sig}` |")
    lines += [
        "",
        "## Use",
        "",
        "```python",
        "from transformers import pipeline",
        'translate = pipeline("translation", model="PATH")',
        'print(translate("A man in an orange hat.")[0]["translation_text"])',
        "```",
        "",
        "The decoder starts from `<bos>` (`decoder_start_token_id`); the tokenizer appends "
        "`<eos>` to each source. `generate` divides beam scores by `length ** length_penalty`, "
        "transformer-mt by GNMT's `((5 + length) / 6) ** alpha`: with a length penalty other "
        "than 0, beam outputs may differ slightly from transformer-mt's own decoding.",
        "",
    ]
    return "\n".join(lines)


# ------------------------------------------------------------------ command line


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="transformer-mt-export",
        description="Export a transformer-mt checkpoint as a Hugging Face model directory "
        "(AutoModelForSeq2SeqLM / pipeline), or as a CTranslate2 model for fast CPU decoding.",
    )
    parser.add_argument("--ckpt", required=True, help="a .ckpt written by train.py")
    parser.add_argument("--out", required=True, type=Path, help="the directory to write")
    parser.add_argument("--format", choices=FORMATS, default="huggingface")
    parser.add_argument(
        "--quantization",
        choices=QUANTIZATIONS,
        default=None,
        help="CTranslate2 weight type (default float32)",
    )
    parser.add_argument("--results", type=Path, help="results.json of evaluate.py, for the card")
    parser.add_argument("--force", action="store_true", help="replace a non-empty --out")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        if args.quantization is not None and args.format != "ctranslate2":
            raise ExportError("--quantization applies to --format ctranslate2 only; add it")
        if args.format == "huggingface":
            export_huggingface(args.ckpt, args.out, args.results, args.force)
        else:
            _check_out_dir(args.out, args.force)
            hf_dir = args.out.with_name(f".{args.out.name}.hf")
            shutil.rmtree(hf_dir, ignore_errors=True)
            try:
                export_huggingface(args.ckpt, hf_dir, args.results, force=True)
                export_ctranslate2(hf_dir, args.out, args.quantization, args.force)
            finally:
                shutil.rmtree(hf_dir, ignore_errors=True)
    except (ExportError, CheckpointError, FileNotFoundError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
