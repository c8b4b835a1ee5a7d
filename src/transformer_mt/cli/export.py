"""``transformer-mt-export``: a checkpoint -> a Hugging Face model directory, or CTranslate2.

``transformer-mt-export --ckpt run/checkpoints/best.ckpt --out exported/`` writes a directory
that ``AutoModelForSeq2SeqLM.from_pretrained`` and ``AutoTokenizer.from_pretrained`` load;
``--format ctranslate2 [--quantization int8]`` converts it for CTranslate2, for fast CPU
decoding (:mod:`transformer_mt.export.convert`). ``--force`` replaces a previous export only.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from transformer_mt.checkpoint import CheckpointError
from transformer_mt.cli.options import OneLineParser, user_error
from transformer_mt.errors import ExportError
from transformer_mt.export.convert import (
    FORMATS,
    QUANTIZATIONS,
    export_ctranslate2,
    export_huggingface,
)
from transformer_mt.export.directory import check_out_dir


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
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
        return user_error(err)
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
