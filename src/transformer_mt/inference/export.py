"""``transformer-mt-export``: a checkpoint -> a Hugging Face model directory, or CTranslate2.

``transformer-mt-export --ckpt run/checkpoints/best.ckpt --out exported/`` writes a directory
that ``AutoModelForSeq2SeqLM.from_pretrained`` and ``AutoTokenizer.from_pretrained`` load:
``config.json``, ``model.safetensors``, ``generation_config.json``, the tokenizer
(``tokenizer.json`` + ``tokenizer_config.json``), a ``README.md`` model card and our tokenizer
metadata in ``transformer_mt/``. ``--format ctranslate2 [--quantization int8]`` converts that
directory with CTranslate2's own Transformers converter, for fast CPU decoding. Which class holds
the model and how the weights map: :mod:`transformer_mt.inference.export_hf`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from transformer_mt.checkpoint import CheckpointError, LoadedModel, load_checkpoint, load_model
from transformer_mt.files import check_output_parent, check_outputs_apart, write_text_atomic
from transformer_mt.inference.export_card import ctranslate2_card, model_card
from transformer_mt.inference.export_hf import ExportError, _require, check_logits, to_huggingface

log = logging.getLogger(__name__)

FORMATS = ("huggingface", "ctranslate2")
#: Written last into every export: ``--force`` replaces a directory only if it holds one.
MARKER = ".transformer-mt-export"
QUANTIZATIONS = ("float32", "int8", "int8_float32", "int16", "float16", "bfloat16")


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
    out_dir = Path(os.path.abspath(out_dir))
    check_out_dir(out_dir, force, [("--ckpt", ckpt), ("--results", results)])
    results_data = _read_results(results) if results is not None else None
    loaded = load_model(ckpt)
    checkpoint = load_checkpoint(ckpt)
    hf, tokenizer = to_huggingface(loaded)
    sample = _sample_texts(loaded)
    diff = check_logits(loaded, hf, sample)
    log.info("exported logits match ours to %.2g on %d sentences", diff, len(sample))
    with _staging(out_dir, "huggingface") as tmp:
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
        _staging(out_dir, "ctranslate2") as tmp,
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


@contextlib.contextmanager
def _staging(out_dir: Path, fmt: str) -> Iterator[Path]:
    """A new sibling directory that replaces ``out_dir`` when the block succeeds.

    The sibling names are fresh (``mkdtemp``), so no existing file is ever removed to make
    room; ``out_dir`` itself is replaced only after :func:`check_out_dir` found it empty or a
    previous export (its marker).
    """
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = _fresh_sibling(out_dir, ".partial")
    try:
        yield tmp
        write_text_atomic(tmp / MARKER, json.dumps({"format": fmt}) + "\n")
        _readable_by_all(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if not out_dir.exists():
        tmp.rename(out_dir)
        return
    # rename() replaces an empty directory: the reserved name takes the previous export.
    old = _fresh_sibling(out_dir, ".old")
    os.replace(out_dir, old)
    tmp.rename(out_dir)
    shutil.rmtree(old, ignore_errors=True)


def _fresh_sibling(out_dir: Path, suffix: str) -> Path:
    """A new empty directory beside ``out_dir`` with the permissions ``mkdir`` would give."""
    path = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", suffix=suffix, dir=out_dir.parent))
    umask = os.umask(0)
    os.umask(umask)
    path.chmod(0o777 & ~umask)  # mkdtemp's 0700 would make the export private
    return path


def _readable_by_all(directory: Path) -> None:
    """Give every file the mode a plain ``open()`` would (0644 under umask 022).

    Some writers (safetensors, temporary files renamed into place) create files readable by
    the owner only; an exported model is meant to be shared.
    """
    umask = os.umask(0)
    os.umask(umask)
    directory.chmod(0o777 & ~umask)
    for path in directory.rglob("*"):
        path.chmod((0o777 if path.is_dir() else 0o666) & ~umask)


def _portable_tokenizer_class(path: Path) -> None:
    """Name the class every ``transformers`` release knows (v5 writes its new backend's name)."""
    config = json.loads(path.read_text(encoding="utf-8"))
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    write_text_atomic(path, json.dumps(config, indent=2, ensure_ascii=False) + "\n")


def check_out_dir(out_dir: Path, force: bool, inputs: Sequence[tuple[str, Any]] = ()) -> None:
    """Refuse, before any work, an ``--out`` that an export would destroy or cannot write.

    ``--force`` replaces a previous export only (recognised by its :data:`MARKER` file), never
    an arbitrary directory, and no output may be, contain or lie inside an input.
    """
    check_outputs_apart([("--out", out_dir)], inputs)
    if out_dir.exists() and not out_dir.is_dir():
        raise ExportError(f"--out {out_dir} is a file; pass a directory path")
    check_output_parent(out_dir, "--out")
    if not out_dir.is_dir() or not any(out_dir.iterdir()):
        return
    if not force:
        raise ExportError(
            f"--out {out_dir} exists and is not empty; pass --force to replace a previous "
            "export there, or choose another directory"
        )
    if not (out_dir / MARKER).is_file():
        raise ExportError(
            f"--out {out_dir} is not a previous export (it has no {MARKER} file), so --force "
            "does not replace it; choose another directory, or empty this one yourself"
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
    parser.add_argument(
        "--force",
        action="store_true",
        help="replace a previous export in --out (never other files)",
    )
    return parser


def _export(args: argparse.Namespace) -> None:
    if args.quantization is not None and args.format != "ctranslate2":
        raise ExportError("--quantization applies to --format ctranslate2 only; add it")
    out = Path(os.path.abspath(args.out))
    if args.format == "huggingface":
        export_huggingface(args.ckpt, out, args.results, args.force)
        return
    check_out_dir(out, args.force, [("--ckpt", args.ckpt), ("--results", args.results)])
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{out.name}.", suffix=".hf", dir=out.parent) as hf:
        hf_dir = export_huggingface(args.ckpt, Path(hf) / "hf", args.results)
        export_ctranslate2(hf_dir, out, args.quantization, args.force)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        _export(args)
    except (ExportError, CheckpointError, ValueError, OSError) as err:
        from transformer_mt.errors import EXIT_USER_ERROR, one_line

        print(f"error: {one_line(err)}", file=sys.stderr)
        return EXIT_USER_ERROR
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
