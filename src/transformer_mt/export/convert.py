"""A checkpoint -> a Hugging Face model directory, and that directory -> CTranslate2.

:func:`export_huggingface` writes what ``AutoModelForSeq2SeqLM``/``AutoTokenizer`` load, plus a
model card; :func:`export_ctranslate2` converts that directory with CTranslate2's converter
(docs/export.md).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from transformer_mt.checkpoint import LoadedModel, build_model, load_checkpoint
from transformer_mt.errors import ExportError, require_export_extra
from transformer_mt.export.card import ctranslate2_card, model_card
from transformer_mt.export.directory import check_out_dir, staging
from transformer_mt.export.huggingface import check_logits, to_huggingface
from transformer_mt.files import write_text_atomic

log = logging.getLogger(__name__)

FORMATS = ("huggingface", "ctranslate2")
QUANTIZATIONS = ("float32", "int8", "int8_float32", "int16", "float16", "bfloat16")


def export_huggingface(
    ckpt: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    results: str | os.PathLike[str] | None = None,
    force: bool = False,
) -> Path:
    """Write the Hugging Face model directory for checkpoint ``ckpt``; return ``out_dir``
    (built beside it and renamed into place when complete)."""
    out_dir = Path(os.path.abspath(out_dir))
    check_out_dir(out_dir, force, [("--ckpt", ckpt), ("--results", results)])
    results_data = read_results(results) if results is not None else None
    checkpoint = load_checkpoint(ckpt)
    loaded = build_model(checkpoint, ckpt, "cpu")
    return write_huggingface(loaded, out_dir, checkpoint=checkpoint, results=results_data)


def write_huggingface(
    loaded: LoadedModel,
    out_dir: Path,
    *,
    checkpoint: dict[str, Any] | None = None,
    results: dict[str, Any] | None = None,
) -> Path:
    """Write the Hugging Face directory of a loaded model (``out_dir`` already checked);
    ``checkpoint`` (the file's dictionary) and ``results`` (evaluate.py's) fill the card."""
    hf, tokenizer = to_huggingface(loaded)
    sample = _sample_texts(loaded)
    diff = check_logits(loaded, hf, sample)
    log.info("exported logits match ours to %.2g on %d sentences", diff, len(sample))
    with staging(out_dir, "huggingface") as tmp:
        hf.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        _portable_tokenizer_class(tmp / "tokenizer_config.json")
        loaded.tokenizer.save(tmp / "transformer_mt")  # our metadata, languages included
        card = model_card(loaded, checkpoint or {}, hf, results, diff)
        write_text_atomic(tmp / "README.md", card)
        if results is not None:
            write_text_atomic(tmp / "results.json", json.dumps(results, indent=2) + "\n")
    log.info("wrote %s (%s)", out_dir, type(hf).__name__)
    return out_dir


def convert_for_engine(loaded: LoadedModel, out_dir: Path) -> None:
    """The CTranslate2 model of a checkpoint already in memory, written into the new
    ``out_dir`` (through a temporary Hugging Face directory): the converter of
    :func:`transformer_mt.inference.engine.open_engine`."""
    with tempfile.TemporaryDirectory() as hf_tmp:
        hf_dir = write_huggingface(loaded, Path(hf_tmp) / "hf")
        export_ctranslate2(hf_dir, out_dir, force=True)


def export_ctranslate2(
    hf_dir: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    quantization: str | None = None,
    force: bool = False,
) -> Path:
    """Convert an exported Hugging Face directory with CTranslate2's Transformers converter.

    The stock Marian loader starts the decoder from a zero embedding and drops the last
    vocabulary entry; ours starts from ``<bos>``. So the generic ``BartLoader`` runs, told
    post- or pre-LN and no embedding LayerNorm.
    """
    converters = require_export_extra("ctranslate2.converters")
    from ctranslate2.converters import transformers as ct2_transformers

    if quantization is not None and quantization not in QUANTIZATIONS:
        raise ExportError(
            f"unknown quantization {quantization!r}; choose one of {', '.join(QUANTIZATIONS)}"
        )
    hf_dir, out_dir = Path(hf_dir), Path(os.path.abspath(out_dir))
    config = json.loads((hf_dir / "config.json").read_text(encoding="utf-8"))
    model_type = config.get("model_type")
    if model_type not in ("marian", "pegasus"):
        raise ExportError(
            f"{hf_dir} holds a {model_type!r} model, not one exported by transformer-mt-export; "
            "export the checkpoint first (transformer-mt-export --ckpt ... --out DIR)"
        )
    check_out_dir(out_dir, force, [("model directory", hf_dir)])

    class Loader(ct2_transformers.BartLoader):  # the converter's own encoder-decoder loader
        @property
        def architecture_name(self) -> str:
            return str(config["architectures"][0])

        def get_model_spec(self, model: Any) -> Any:
            model.config.normalize_before = model_type == "pegasus"
            model.config.normalize_embedding = False  # no LayerNorm on the embeddings
            return super().get_model_spec(model)

    config_class = "MarianConfig" if model_type == "marian" else "PegasusConfig"
    with (
        _loader_for(ct2_transformers, config_class, Loader()),
        staging(out_dir, "ctranslate2") as tmp,
    ):
        converter = converters.TransformersConverter(str(hf_dir))
        converter.convert(str(tmp), quantization=quantization, force=True)
        if (hf_dir / "generation_config.json").is_file():
            shutil.copy2(hf_dir / "generation_config.json", tmp / "generation_config.json")
        if (hf_dir / "README.md").is_file():
            card = ctranslate2_card(
                (hf_dir / "README.md").read_text(encoding="utf-8"), quantization
            )
            write_text_atomic(tmp / "README.md", card)
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


def _portable_tokenizer_class(path: Path) -> None:
    """Name the class every ``transformers`` release knows (v5 writes its new backend's name)."""
    config = json.loads(path.read_text(encoding="utf-8"))
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    write_text_atomic(path, json.dumps(config, indent=2, ensure_ascii=False) + "\n")


def read_results(path: str | os.PathLike[str]) -> dict[str, Any]:
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
