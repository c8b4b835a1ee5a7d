"""``transformer-mt-score``: score given translations with a checkpoint (forced decoding).

``transformer-mt-score --ckpt C --source S --target T`` (or ``-i pairs.tsv``, one
``source<TAB>target`` line per pair) prints one line per pair, in input order::

    total log-probability <TAB> tokens <TAB> mean log-probability per token

where ``tokens`` counts the target's subwords and ``<eos>``; ``--tokens`` adds the per-token
log-probabilities and the subwords; ``--ckpt`` repeated scores with an ensemble
(:mod:`transformer_mt.inference.score`).
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from transformer_mt.checkpoint import CheckpointError
from transformer_mt.cli.options import (
    ERRORS_FIX,
    OneLineParser,
    add_errors_argument,
    add_model_arguments,
    configure_logging,
    open_translator,
    user_error,
)
from transformer_mt.files import (
    check_output_file,
    check_outputs_apart,
    read_text_lines,
    write_text_atomic,
)
from transformer_mt.inference.score import format_score, score_pairs

log = logging.getLogger(__name__)


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="transformer-mt-score",
        description=(
            "Score given translations with a transformer-mt checkpoint (forced decoding): one "
            "line per pair, total log-probability<TAB>tokens<TAB>mean log-probability per "
            "token (tokens count <eos>)."
        ),
        epilog="example: transformer-mt-score --ckpt best.ckpt --source test.de --target test.en",
    )
    add_model_arguments(parser)
    parser.add_argument("--source", help="source file, one sentence a line")
    parser.add_argument("--target", help="target file, line-aligned with --source")
    parser.add_argument("-i", "--input", help="source<TAB>target lines instead ('-' = stdin)")
    parser.add_argument("-o", "--output", default="-", help="output file ('-' = stdout)")
    parser.add_argument(
        "--tokens",
        action="store_true",
        help="add the per-token log-probabilities and the subwords (<eos> last)",
    )
    parser.add_argument(
        "--truncate",
        action="store_true",
        help="cut sides longer than the model takes (with a warning) instead of refusing",
    )
    add_errors_argument(parser)
    return parser


def read_pairs(args: argparse.Namespace) -> tuple[list[str], list[str]]:
    """(sources, targets) from ``--source``/``--target`` or ``-i`` TSV."""
    if args.input is not None:
        if args.source or args.target:
            raise ValueError("give either -i PAIRS.tsv or --source S --target T, not both")
        sources, targets = [], []
        for n, line in enumerate(
            read_text_lines(args.input, "input", errors=args.errors, fix=ERRORS_FIX), start=1
        ):
            if "\t" not in line:
                raise ValueError(
                    f"{args.input} line {n} has no tab; each line must be source<TAB>target"
                )
            source, target = line.split("\t", 1)
            sources.append(source)
            targets.append(target)
        return sources, targets
    if not (args.source and args.target):
        raise ValueError("give --source S --target T (line-aligned files) or -i PAIRS.tsv")
    sources = read_text_lines(args.source, "input", errors=args.errors, fix=ERRORS_FIX)
    targets = read_text_lines(args.target, "input", errors=args.errors, fix=ERRORS_FIX)
    if len(sources) != len(targets):
        raise ValueError(
            f"--source {args.source} has {len(sources)} lines but --target {args.target} has "
            f"{len(targets)}; they must be line-aligned"
        )
    return sources, targets


def _check_output(args: argparse.Namespace) -> None:
    """Refuse, before any work, an ``--output`` that is an input or cannot be written."""
    inputs = [args.input, args.source, args.target, *args.ckpt]
    check_outputs_apart([("--output", args.output)], [("input", name) for name in inputs])
    check_output_file(args.output, "--output")


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point; returns the exit status (2: a user error, one line)."""
    args = build_parser().parse_args(argv)
    configure_logging(args.quiet)
    try:
        _check_output(args)
        sources, targets = read_pairs(args)
        translator = open_translator(args)
        scores = score_pairs(
            translator, sources, targets, truncate=args.truncate, progress=args.progress
        )
        text = "".join(format_score(s, args.tokens) for s in scores)
        if args.output == "-":
            sys.stdout.write(text)
            sys.stdout.flush()
        else:
            write_text_atomic(Path(args.output), text)
    except (CheckpointError, ValueError, OSError) as err:
        return user_error(err)
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
