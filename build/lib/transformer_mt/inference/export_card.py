"""README.md model card of an exported directory: what the model is, how it was made, scores."""

from __future__ import annotations

from typing import Any

from transformer_mt.checkpoint import LoadedModel
from transformer_mt.inference.export_hf import _search_config


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
