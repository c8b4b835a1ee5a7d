"""What the flag commands (translate, score, export, serve) share: options, spelling, errors.

The library names a setting as its config does (``beam_size``); here it is spelled as these
commands take it (``--beam-size 1``), so that a fix in an error line can be typed as given.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from transformer_mt.checkpoint import load_model, resolve_device
from transformer_mt.errors import EXIT_USER_ERROR, SettingError, one_line
from transformer_mt.files import TEXT_ERRORS
from transformer_mt.inference.engine import ENGINES, Converter, open_engine
from transformer_mt.inference.translator import Translator

#: The option that reads undecodable input bytes as U+FFFD instead of refusing them.
ERRORS_FIX = "--errors replace"

#: A setting's name in the library -> its flag here, where the two differ beyond ``_``/``-``.
FLAG_NAMES = {"max_sentences": "--batch-size"}


class OneLineParser(argparse.ArgumentParser):
    """argparse whose mistakes are one ``error:`` line (not the usage and a second line)."""

    def error(self, message: str) -> NoReturn:
        print(f"error: {message}; see {self.prog} --help", file=sys.stderr)
        raise SystemExit(2)


def flag(setting: str, value: Any) -> str:
    """``beam_size``, 1 -> ``--beam-size 1``: a :class:`SettingError` fix as a flag."""
    name = FLAG_NAMES.get(setting, "--" + setting.replace("_", "-"))
    return name if value is True else f"{name} {value}"


def in_flags(err: BaseException) -> BaseException:
    """``err`` with a :class:`SettingError`'s fix written as flags (other errors as they are)."""
    if isinstance(err, SettingError):
        return ValueError(err.render(flag))
    return err


def user_error(err: BaseException) -> int:
    """Print the one ``error:`` line of a user mistake; the exit status for it."""
    print(f"error: {one_line(in_flags(err))}", file=sys.stderr)
    return EXIT_USER_ERROR


def configure_logging(quiet: bool) -> None:
    logging.basicConfig(
        level=logging.ERROR if quiet else logging.WARNING,
        format="%(levelname)s: %(message)s",
        stream=sys.stderr,
    )


def add_errors_argument(parser: argparse.ArgumentParser) -> None:
    """``--errors``: how every command that reads text treats bytes that are not UTF-8."""
    parser.add_argument(
        "--errors",
        choices=TEXT_ERRORS,
        default="strict",
        help="input bytes that are not UTF-8: strict (refuse, naming the line) or replace "
        "(read them as U+FFFD, with a warning that counts the lines)",
    )


def add_engine_arguments(parser: argparse.ArgumentParser) -> None:
    """``--engine``, ``--ct2-model``, ``--compute-type``: the engine that decodes."""
    parser.add_argument("--engine", choices=ENGINES, default="torch", help="decoding engine")
    parser.add_argument("--ct2-model", help="CTranslate2 dir of transformer-mt-export (optional)")
    parser.add_argument(
        "--compute-type",
        help="weights: int8 (torch: dynamic quantization of the linear layers, CPU), float32; "
        "CTranslate2 also runs int8_float32, int16, ...",
    )


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of every command that decodes or scores with checkpoints."""
    parser.add_argument(
        "--ckpt",
        required=True,
        action="append",
        help="checkpoint (.ckpt) written by train.py; repeat it for an ensemble (the models' "
        "log-probabilities are averaged; they must share the tokenizer)",
    )
    parser.add_argument(
        "--max-tokens",
        type=int,
        help="padded source tokens per batch (default: the checkpoint's data.eval_max_tokens)",
    )
    parser.add_argument("--batch-size", type=int, help="sentences per batch (instead of tokens)")
    parser.add_argument(
        "--tgt-lang",
        help="the language to translate into, for a multilingual checkpoint (its tag leads "
        "every source); a checkpoint of one direction takes only its own",
    )
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:1, mps")
    parser.add_argument("--progress", action="store_true", help="show a progress bar on stderr")
    parser.add_argument("-q", "--quiet", action="store_true", help="only errors on stderr")
    add_engine_arguments(parser)


def check_engine_flags(args: argparse.Namespace) -> None:
    """CTranslate2's model directory means nothing to the torch engine: refuse it."""
    for name, value in (("--ct2-model", args.ct2_model),):
        if value is not None and args.engine != "ctranslate2":
            raise ValueError(f"{name} applies to --engine ctranslate2 only; add it")


def converter(engine: str | None, ct2_model: str | None) -> Converter | None:
    """The export wing's CTranslate2 converter when the ``ctranslate2`` engine comes without a
    converted model directory, else ``None`` (imported only then: it needs the export extra).
    Every command that opens an engine asks here, the Hydra ones included."""
    if engine != "ctranslate2" or ct2_model:
        return None
    from transformer_mt.export.convert import convert_for_engine

    return convert_for_engine


def open_translator(args: argparse.Namespace) -> Translator:
    """Load ``args.ckpt`` once (one or an ensemble) and its engine, as the command line asks.

    Raises:
        ValueError: CTranslate2 options without ``--engine ctranslate2``, or an engine that
            cannot decode these checkpoints.
    """
    check_engine_flags(args)
    return load_translator(
        args.ckpt, engine=args.engine, ct2_model=args.ct2_model, compute_type=args.compute_type,
        device=args.device, tgt_lang=args.tgt_lang, max_tokens=args.max_tokens,
        max_sentences=args.batch_size,
    )  # fmt: skip


def load_translator(
    paths: Sequence[str | os.PathLike[str]],
    *,
    engine: str,
    ct2_model: str | os.PathLike[str] | None,
    compute_type: str | None,
    device: str | None,
    tgt_lang: str | None,
    max_tokens: int | None,
    max_sentences: int | None,
) -> Translator:
    """The checkpoints at ``paths`` (one, or an ensemble) on ``device`` with their ``engine``:
    the commands' translator, and the Python API's."""
    loaded = [load_model(path, resolve_device(device)) for path in paths]
    decoder = open_engine(
        engine, loaded, ct2_model=ct2_model, compute_type=compute_type,
        convert=converter(engine, str(ct2_model) if ct2_model else None),
    )  # fmt: skip
    return Translator(
        loaded, max_tokens=max_tokens, max_sentences=max_sentences, engine=decoder,
        tgt_lang=tgt_lang,
    )  # fmt: skip
