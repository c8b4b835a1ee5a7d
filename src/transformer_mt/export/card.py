"""README.md model card of an exported directory: what the model is, how it was made, scores."""

from __future__ import annotations

import importlib.metadata
import re
from typing import Any

from transformer_mt.checkpoint import LoadedModel
from transformer_mt.inference.search import SearchConfig


def _training_time(checkpoint: dict[str, Any]) -> str | None:
    for key, state in (checkpoint.get("callbacks") or {}).items():
        if str(key).startswith("Timer") and isinstance(state, dict):
            elapsed = (state.get("time_elapsed") or {}).get("train")
            if elapsed:
                return f"{float(elapsed) / 60:.1f} min"
    return None


def _project() -> tuple[str, str | None]:
    """``("transformer-mt X.Y", url)`` from the installed package's metadata (url may be None)."""
    try:
        meta = importlib.metadata.metadata("transformer-mt")
    except importlib.metadata.PackageNotFoundError:
        return "transformer-mt", None
    urls = [u.split(",", 1)[-1].strip() for u in meta.get_all("Project-URL") or []]
    url = meta.get("Home-page") or (urls[0] if urls else None)
    return f"transformer-mt {meta.get('Version')}", url


def _licence() -> str:
    try:
        text = importlib.metadata.metadata("transformer-mt").get("License-Expression")
    except importlib.metadata.PackageNotFoundError:
        text = None
    return str(text or "MIT")


def _val_bleu(checkpoint: dict[str, Any]) -> float | None:
    """The val/bleu ModelCheckpoint recorded for this checkpoint (decoded as stored)."""
    for key, state in (checkpoint.get("callbacks") or {}).items():
        if not str(key).startswith("ModelCheckpoint") or not isinstance(state, dict):
            continue
        if state.get("monitor") == "val/bleu" and state.get("current_score") is not None:
            return float(state["current_score"])
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
    search = SearchConfig.from_stored(loaded.decoding)
    n_params = sum(p.numel() for p in hf_model.parameters())
    project, url = _project()
    licence = _licence()
    lines = [
        "---",
        f"language: [{src}, {tgt}]",
        f"license: {licence.lower()}",
        "library_name: transformers",
        "pipeline_tag: translation",
        "tags: [translation, transformer-mt]",
        "---",
        "",
        f"# transformer-mt {src}->{tgt}",
        "",
        "A Transformer (Vaswani et al., 2017) trained from scratch with "
        + (f"[{project}]({url})" if url else project)
        + f" and {CLASS_MARK}`{type(hf_model).__name__}` (exactly the same function: logits "
        f"match the original to {logits_diff:.1e}).",
        "",
        "| | |",
        "|---|---|",
        f"| direction | {', '.join(data.get('directions') or []) or f'{src} -> {tgt}'} |",
        f"| training data | {dataset} |",
        f"| architecture | {'pre-LN' if c.norm_first else 'post-LN'}, d_model {c.d_model}, "
        f"{c.n_heads} heads, d_ff {c.d_ff}, {c.n_encoder_layers}+{c.n_decoder_layers} layers, "
        f"{c.activation} |",
        f"| parameters | {n_params / 1e6:.2f} M |",
        f"| vocabulary | {c.src_vocab_size} byte-level BPE tokens, joint |",
        f"| training | step {checkpoint.get('global_step')}, epoch {checkpoint.get('epoch')}"
        + (f", {t}" if (t := _training_time(checkpoint)) else "")
        + " |",
        f"| decoding | {_decoding(search)} |",
    ]
    if (val := _val_bleu(checkpoint)) is not None:
        lines.append(f"| bleu (validation, during training) | {val:.2f} |")
    lines += _result_rows(results)
    lines += ["", *_target_tags(loaded), USE_MARK, "", *huggingface_usage(search)]
    lines += _licence_lines(licence, dataset)
    return "\n".join(lines)


def _target_tags(loaded: LoadedModel) -> list[str]:
    """For a multilingual model: how the target language is chosen (the source's first token)."""
    langs = loaded.tokenizer.target_languages
    if not langs:
        return []
    directions = ", ".join((loaded.data or {}).get("directions", []))
    tags = ", ".join(f"`<2{lang}>`" for lang in langs)
    example = f"<2{langs[0]}> A man in an orange hat."
    return [
        "## Target language",
        "",
        f"This model translates {directions}. Start each source with the tag of the language "
        f"to translate into ({tags}), a special token of the tokenizer: `{example}` for "
        "`generate`; for CTranslate2 put the tag's token first in each source's tokens. "
        f"`transformer-mt-translate --tgt-lang {langs[0]}` does it for you.",
        "",
    ]


#: Where the HF and CTranslate2 cards differ: the class sentence and the usage section.
CLASS_MARK = "exported as "
USE_MARK = "## Use"


def _decoding(search: Any) -> str:
    if search.beam_size == 1:
        return f"greedy, output cap {search.max_len_a} x source tokens + {search.max_len_b}"
    return (
        f"beam {search.beam_size}, length penalty {search.length_penalty} "
        f"({search.length_norm}), output cap "
        f"{search.max_len_a} x source tokens + {search.max_len_b}"
    )


def _result_rows(results: dict[str, Any] | None) -> list[str]:
    if not results:
        return []
    metrics = results.get("metrics") or {}
    signature = results.get("signature") or {}
    split = (results.get("data") or {}).get("split", "test")
    return [
        f"| {name} ({split}) | {metrics[name]:.2f} `{signature.get(name, '')}` |"
        for name in ("bleu", "chrf")
        if name in metrics
    ]


def _licence_lines(licence: str, dataset: str) -> list[str]:
    return [
        "## Licence",
        "",
        f"{licence}, as transformer-mt; the terms of the training data ({dataset}) apply as well.",
        "",
    ]


def _length_norm_note(search: Any) -> str:
    if search.length_norm == "power":
        return (
            "Length penalties have one form: `generate` and transformer-mt (`length_norm: "
            "power`) both divide beam scores by `length ** length_penalty`."
        )
    return (
        "Length penalties differ in form: `generate` divides by `length ** length_penalty`, "
        "transformer-mt (`length_norm: gnmt`) by GNMT's `((5 + length) / 6) ** alpha`; at 0 both "
        "rank by log-probability, otherwise beam outputs may differ slightly."
    )


def huggingface_usage(search: Any) -> list[str]:
    """The card's usage section for ``transformers``: tokenizer, length cap, ``generate``."""
    beam = (
        f"num_beams={search.beam_size}, early_stopping=True, length_penalty={search.length_penalty}"
        if search.beam_size > 1
        else "num_beams=1"
    )
    return [
        "```python",
        "from transformers import AutoModelForSeq2SeqLM, AutoTokenizer",
        "",
        'MODEL = "path/to/this/directory"',
        "tokenizer = AutoTokenizer.from_pretrained(MODEL)",
        "model = AutoModelForSeq2SeqLM.from_pretrained(MODEL)",
        'sources = ["A man in an orange hat."]',
        'batch = tokenizer(sources, return_tensors="pt", padding=True, truncation=True)',
        "# transformer-mt's output cap: max_len_a * source tokens + max_len_b",
        f'cap = int({search.max_len_a} * int(batch["attention_mask"].sum(1).max()) + '
        f"{search.max_len_b})",
        f"out = model.generate(**batch, max_new_tokens=cap, {beam})",
        "print(tokenizer.batch_decode(out, skip_special_tokens=True))",
        "```",
        "",
        "`generation_config.json` holds the decoding transformer-mt stored with the model, "
        "so `generate` without options decodes as transformer-mt does, except for the "
        "per-sentence length cap, which `generate` has no setting for (hence `max_new_tokens` "
        "above, exact for one sentence, the longest source's cap for a batch). For beam "
        "search pass `num_beams=K, early_stopping=True` (transformer-mt stops when K "
        "hypotheses have ended). " + _length_norm_note(search) + " "
        "`truncation=True` cuts sources at the tokenizer's `model_max_length`, where "
        "transformer-mt's translator cuts them.",
        "",
        *STEERING_USAGE,
    ]


#: How to steer ``generate`` as ``transformer-mt-translate`` steers our search (run after the
#: first snippet; tests/export runs it).
STEERING_USAGE = [
    "### Steering the output",
    "",
    "```python",
    "import torch",
    "",
    "# Sampling (transformer-mt-translate --sampling-topk 20 --temperature 1.5 --nbest 2)",
    "torch.manual_seed(3)",
    "samples = model.generate(**batch, max_new_tokens=cap, do_sample=True, top_k=20,",
    "                         temperature=1.5, num_return_sequences=2)",
    "print(tokenizer.batch_decode(samples, skip_special_tokens=True))",
    "",
    "# A forced start (--prefix-file): the decoder's input begins with it",
    'prefix = tokenizer(text_target=["Ein Mann"], add_special_tokens=False).input_ids[0]',
    "start = torch.tensor([[model.generation_config.decoder_start_token_id, *prefix]])",
    "one = tokenizer(sources[:1], return_tensors='pt')",
    "out = model.generate(**one, decoder_input_ids=start, max_new_tokens=cap)",
    "print(tokenizer.batch_decode(out, skip_special_tokens=True))",
    "```",
    "",
    "transformer-mt seeds each sentence's samples from the seed and the sentence, so they "
    "repeat in any batch; `generate` draws from torch's one generator, so its samples change "
    "with the batch. Word alignments (`--alignments`) come from the second-to-last decoder layer's "
    "cross-attention, averaged over heads, at the step that predicts each word: load the "
    'model with `attn_implementation="eager"` and pass `output_attentions=True, '
    "return_dict_in_generate=True` to get `cross_attentions`. Terminology constraints "
    "(`--constraints-file`) have no built-in counterpart: transformers 5 moved constrained "
    "beam search (`force_words_ids`) to a Hub repository that `generate` loads with "
    "`trust_remote_code=True`.",
    "",
]


def ctranslate2_card(hf_card: str, quantization: str | None) -> str:
    """The Hugging Face card with the CTranslate2 class sentence and usage section."""
    head = hf_card.split(USE_MARK, 1)[0].replace(
        "library_name: transformers", "library_name: ctranslate2"
    )
    head = re.sub(
        rf"{CLASS_MARK}`(\w+)`",
        rf"converted to CTranslate2 ({quantization or 'float32'}) from `\1`",
        head,
    )
    tail = hf_card.split("## Licence", 1)[-1]
    usage = [
        USE_MARK,
        "",
        "```python",
        "import ctranslate2",
        "from transformer_mt.data.tokenizer import Tokenizer",
        "",
        'MODEL = "path/to/this/directory"',
        'tokenizer = Tokenizer.load(f"{MODEL}/transformer_mt")',
        "translator = ctranslate2.Translator(MODEL)",
        'sources = ["A man in an orange hat."]',
        "eos = tokenizer.src.id_to_token(tokenizer.eos_id)",
        "tokens = [[tokenizer.src.id_to_token(i) for i in ids] + [eos]",
        "          for ids in tokenizer.encode_src_batch(sources)]",
        "results = translator.translate_batch(tokens, beam_size=1)",
        "ids = [[tokenizer.tgt.token_to_id(t) for t in r.hypotheses[0]] for r in results]",
        "print(tokenizer.decode_hypotheses(ids))",
        "```",
        "",
        "`transformer_mt/` holds the tokenizer, read by the transformer-mt package. "
        "`transformer-mt-translate --engine ctranslate2 --ct2-model DIR --ckpt CKPT` decodes "
        "with the stored decoding and transformer-mt's per-sentence length cap; "
        "`translate_batch` takes `target_prefix=` (a forced start, as `--prefix-file`), "
        "`sampling_topk=`, `sampling_topp=` and `sampling_temperature=` (as `--sampling-topk` "
        "... without `--seed`: CTranslate2 seeds its generator per worker thread).",
        "",
        "## Licence",
    ]
    return head + "\n".join(usage) + tail
