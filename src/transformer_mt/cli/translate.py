"""``transformer-mt-translate``: translate text with a checkpoint, one output line per input.

``transformer-mt-translate --ckpt run/checkpoints/last.ckpt < input.en > output.de``

One output line per input line, in order (empty lines stay empty), as text, an n-best TSV
(``--nbest``) or JSON lines; lines are read, sorted and translated ``--buffer-size`` at a time
by the :class:`~transformer_mt.inference.translator.Translator`. Decoding options default to
those stored in the checkpoint.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import sys
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import BinaryIO, TextIO

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
    atomic_write,
    check_output_file,
    check_outputs_apart,
    decode_lines,
    replaced_lines_warning,
)
from transformer_mt.inference.alignment import pharaoh
from transformer_mt.inference.search import LENGTH_NORMS, SearchConfig
from transformer_mt.inference.steer_files import read_steering
from transformer_mt.inference.translator import (
    BEST_DECODING,
    Candidate,
    Translation,
    Translator,
    decoding_from,
)

log = logging.getLogger(__name__)


def _chunks(lines: Iterable[str], size: int) -> Iterator[list[str]]:
    chunk: list[str] = []
    for line in lines:
        chunk.append(line)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="transformer-mt-translate",
        description=(
            "Translate text with a transformer-mt checkpoint: one output line per input line, "
            "in order (empty lines stay empty). Decoding options default to those stored in "
            "the checkpoint."
        ),
        epilog="example: transformer-mt-translate --ckpt run/last.ckpt < in.en > out.de",
    )
    add_model_arguments(parser)
    parser.add_argument(
        "-i", "--input", default="-", help="input file, one sentence a line ('-' = stdin)"
    )
    parser.add_argument("-o", "--output", default="-", help="output file ('-' = stdout)")
    parser.add_argument(
        "--decoding-from",
        metavar="PATH",
        help=f"{BEST_DECODING} of a decoding sweep (or its directory); the flags below win",
    )
    parser.add_argument("--beam-size", type=int, help="beam size (1 = greedy)")
    parser.add_argument("--greedy", action="store_true", help="greedy search (= --beam-size 1)")
    parser.add_argument("--length-penalty", type=float, help="length penalty alpha")
    parser.add_argument(
        "--length-norm",
        choices=LENGTH_NORMS,
        help="divide beam scores by ((5 + |Y|) / 6) ** alpha (gnmt) or |Y| ** alpha (power)",
    )
    parser.add_argument("--max-len-a", type=float, help="output length cap a * src_len + b: a")
    parser.add_argument("--max-len-b", type=int, help="output length cap a * src_len + b: b")
    parser.add_argument(
        "--nbest",
        type=int,
        help="write the K best hypotheses of each line (K <= beam size; with sampling, K "
        "samples) as index<TAB>rank<TAB>score<TAB>translation lines (index from 0, rank from 1)",
    )
    parser.add_argument(
        "--format",
        choices=("text", "jsonl"),
        default="text",
        help='jsonl: one {"index", "source", "hypotheses": [{"text", "score", "tokens"}]} '
        "object per input line (with --alignments, an 'alignment' in each hypothesis)",
    )
    parser.add_argument(
        "--buffer-size",
        type=int,
        default=10000,
        help="lines read, sorted and translated at a time (default 10000)",
    )
    add_errors_argument(parser)
    add_steering_arguments(parser)
    return parser


def add_steering_arguments(parser: argparse.ArgumentParser) -> None:
    """Sampling, a forced start, required phrases and word alignments."""
    steer = parser.add_argument_group(
        "steering", "sampling, a forced start and required phrases (docs/evaluation.md)"
    )
    steer.add_argument(
        "--sampling-topk", type=int, metavar="K",
        help="sample each token from the K most likely (0 = the whole vocabulary)",
    )  # fmt: skip
    steer.add_argument(
        "--sampling-topp", type=float, metavar="P",
        help="sample from the most likely tokens whose probability reaches P, in (0, 1]",
    )  # fmt: skip
    steer.add_argument("--temperature", type=float, help="sampling temperature (> 1 flattens)")
    steer.add_argument(
        "--seed", type=int, help="sampling seed: the same seed gives the same samples"
    )
    steer.add_argument(
        "--prefix-file", metavar="FILE",
        help="one target prefix per input line: each output starts with it (empty: none)",
    )  # fmt: skip
    steer.add_argument(
        "--constraints-file", metavar="FILE",
        help='one JSON list of target phrases per input line, e.g. ["Katzen", "im Garten"], '
        "that each output contains (beam search, torch engine)",
    )  # fmt: skip
    steer.add_argument(
        "--alignments", action="store_true",
        help="add each output's word alignment to its source (Pharaoh i-j pairs): a TAB "
        "column in text, an 'alignment' field in jsonl",
    )  # fmt: skip


def _open_input(name: str) -> BinaryIO:
    """The raw bytes of ``name`` ('-' = stdin); decoded by :func:`decode_lines`."""
    if name == "-":
        return sys.stdin.buffer
    if Path(name).is_dir():
        raise IsADirectoryError(f"--input {name} is a directory; pass a text file")
    if not Path(name).exists():
        raise FileNotFoundError(f"--input {name} does not exist; check the path")
    try:
        return open(name, "rb")
    except PermissionError:
        raise PermissionError(
            f"--input {name} cannot be read (permission denied); fix its permissions"
        ) from None


def _check_input_text(name: str, errors: str) -> None:
    """Refuse a file with undecodable bytes before any work (stdin is checked as it streams)."""
    if name == "-" or errors != "strict" or not Path(name).is_file():
        return  # stdin, or a path _open_input reports
    with open(name, "rb") as handle:
        for _ in decode_lines(handle, name, errors=errors, fix=ERRORS_FIX):
            pass


@contextlib.contextmanager
def _open_output(name: str) -> Iterator[TextIO]:
    """stdout, or the file written through a temporary file and renamed when complete (a
    failed run leaves an existing output as it was)."""
    if name != "-":
        with atomic_write(name, "w", encoding="utf-8", newline="\n") as handle:
            yield handle
        return
    sink = io.TextIOWrapper(sys.stdout.buffer, encoding="utf-8", newline="\n")
    try:
        yield sink
    finally:
        sink.flush()
        sink.detach()  # leave sys.stdout usable


def _open_translator(args: argparse.Namespace) -> tuple[Translator, SearchConfig]:
    """The translator and search the options ask for; refuses unsafe paths before loading."""
    check_outputs_apart(
        [("--output", args.output)],
        [
            ("--input", args.input),
            *(("--ckpt", c) for c in args.ckpt),
            ("--ct2-model", args.ct2_model),
            ("--prefix-file", args.prefix_file),
            ("--constraints-file", args.constraints_file),
        ],
    )
    check_output_file(args.output, "--output")
    _check_input_text(args.input, args.errors)
    if args.buffer_size < 1:
        raise ValueError(f"--buffer-size must be >= 1, got {args.buffer_size}")
    if args.constraints_file and (args.sampling_topk is not None or args.sampling_topp is not None):
        raise ValueError(
            "--constraints-file needs a beam search, but --sampling-topk/--sampling-topp "
            "sample; leave out the sampling options and search with e.g. --beam-size 5"
        )
    if args.constraints_file and args.engine != "torch":
        raise ValueError(
            f"--constraints-file needs the torch engine's constrained beam search ({args.engine} "
            "has none); use --engine torch"
        )
    translator = open_translator(args)
    search = SearchConfig.from_stored(
        {**(translator.loaded.decoding or {}), **decoding_from(args.decoding_from)},
        beam_size=1 if args.greedy else args.beam_size,
        length_penalty=args.length_penalty,
        length_norm=args.length_norm,
        max_len_a=args.max_len_a,
        max_len_b=args.max_len_b,
        nbest=args.nbest,
        sampling_topk=args.sampling_topk,
        sampling_topp=args.sampling_topp,
        temperature=args.temperature,
        seed=args.seed,
    )
    return translator, search


def _steering(
    args: argparse.Namespace, lines: Iterable[str]
) -> tuple[Iterable[str], list[str] | None, list[list[str]] | None]:
    """The input lines and, with ``--prefix-file``/``--constraints-file``, their prefixes and
    constraints. With either file the whole input is read first, so a count that does not
    match is refused before any output."""
    if not (args.prefix_file or args.constraints_file):
        return lines, None, None
    lines = list(lines)
    prefixes, constraints = read_steering(
        args.prefix_file, args.constraints_file, len(lines), errors=args.errors,
        flags=("--prefix-file", "--constraints-file"),
    )  # fmt: skip
    return lines, prefixes, constraints


def format_translation(translation: Translation, index: int, args: argparse.Namespace) -> str:
    """The output lines of one input line: text, n-best TSV or a JSON object; with
    alignments, a last TAB column (or an ``alignment`` field) of Pharaoh pairs."""
    if args.format == "jsonl":
        hyps = [
            {"text": h.text, "score": round(h.score, 6), "tokens": h.tokens}
            | ({"alignment": pharaoh(h.alignment)} if h.alignment is not None else {})
            for h in translation.hypotheses
        ]
        record = {"index": index, "source": translation.source, "hypotheses": hyps}
        return json.dumps(record, ensure_ascii=False) + "\n"

    def aligned(h: Candidate) -> str:
        return "" if h.alignment is None else f"\t{pharaoh(h.alignment)}"

    if args.nbest is None:
        return translation.text + aligned(translation.hypotheses[0]) + "\n"
    return "".join(
        f"{index}\t{rank}\t{h.score:.4f}\t{h.text}{aligned(h)}\n"
        for rank, h in enumerate(translation.hypotheses, start=1)
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point; returns the exit status: 2 with one ``error:`` line for a
    user error (docs/errors.md), 130 for Ctrl-C."""
    args = build_parser().parse_args(argv)
    configure_logging(args.quiet)
    try:
        translator, search = _open_translator(args)
        source = _open_input(args.input)
    except (CheckpointError, ValueError, OSError) as err:
        return user_error(err)
    start, count, replaced = time.perf_counter(), 0, []
    lines: Iterable[str] = decode_lines(
        source, args.input, errors=args.errors, replaced=replaced, fix=ERRORS_FIX
    )
    try:
        lines, prefixes, constraints = _steering(args, lines)
        with _open_output(args.output) as sink:
            for chunk in _chunks(lines, args.buffer_size):
                part = slice(count, count + len(chunk))
                for translation in translator.translate_batch(
                    chunk, search, progress=args.progress, alignments=args.alignments,
                    prefixes=None if prefixes is None else prefixes[part],
                    constraints=None if constraints is None else constraints[part],
                ):  # fmt: skip
                    sink.write(format_translation(translation, count, args))
                    count += 1
                sink.flush()
    except KeyboardInterrupt:
        return 130
    except (ValueError, OSError) as err:  # bytes that are not UTF-8 on stdin, a full disk
        if count and args.output == "-":
            # Streamed input: the lines before the bad one are out already; say how many.
            done = "1 line was" if count == 1 else f"{count} lines were"
            err = ValueError(f"{err} ({done} translated and written before it)")
        return user_error(err)
    finally:
        if args.input != "-":
            source.close()
    if replaced:
        log.warning(replaced_lines_warning(args.input, replaced))
    log.info("translated %d lines in %.1f s", count, time.perf_counter() - start)
    return 0


if __name__ == "__main__":
    sys.exit(main())
