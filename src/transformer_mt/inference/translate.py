"""Translate text with a checkpoint: the :class:`Translator` and the command line.

``transformer-mt-translate --ckpt run/checkpoints/last.ckpt < input.en > output.de``

One output line per input line, in order. Empty and whitespace-only lines give empty lines;
sentences are sorted by length and batched by a token budget (or a sentence count), then put
back in input order, by the decode loop validation and evaluate.py use
(:mod:`transformer_mt.inference.decode`); a source longer than the checkpoint's
``data.max_len`` (or the model's positional ``max_len`` - 1) is cut with a warning. Byte-level BPE encodes any Unicode text (emoji, CJK), so no input crashes the
tokenizer.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import re
import sys
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, BinaryIO, TextIO

import torch

from transformer_mt.checkpoint import CheckpointError, LoadedModel, load_model
from transformer_mt.data.batching import decode_sampler
from transformer_mt.data.collate import Collate, source_limit
from transformer_mt.data.config import DataConfig
from transformer_mt.files import (
    TEXT_ERRORS,
    atomic_write,
    check_output_file,
    check_outputs_apart,
    decode_lines,
    replaced_lines_warning,
)
from transformer_mt.inference.decode import Engine, best_tokens, decode, progress_bar, score
from transformer_mt.inference.engine import TorchEngine
from transformer_mt.inference.search import LENGTH_NORMS, Hypothesis, SearchConfig

log = logging.getLogger(__name__)

#: The option that reads undecodable input bytes as U+FFFD instead of refusing them.
ERRORS_FIX = "--errors replace"

#: Budget when neither the caller nor the checkpoint's data config gives one.
DEFAULT_MAX_TOKENS = 4096


def resolve_device(device: str | None) -> str:
    """``"auto"``/``None`` -> ``"cuda"`` if available, else ``"mps"`` if available, else CPU."""
    if device in (None, "", "auto"):
        if torch.cuda.is_available():
            return "cuda"
        if torch.backends.mps.is_available():
            return "mps"
        return "cpu"
    if str(device).startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device={device} but CUDA is not available; use device=cpu")
    return str(device)


def search_config(decoding: dict[str, Any] | None, **overrides: Any) -> SearchConfig:
    """A :class:`SearchConfig` from a checkpoint's decoding options plus non-``None`` overrides."""
    known = set(asdict(SearchConfig()))
    values = {k: v for k, v in (decoding or {}).items() if k in known}
    values.update({k: v for k, v in overrides.items() if v is not None})
    return SearchConfig(**values)


#: What a decoding sweep (``evaluate.py -m ... decoding.beam_size=4,5,8``) leaves in its
#: sweep directory: the best setting, for ``decoding_from=`` / ``--decoding-from``.
BEST_DECODING = "best_decoding.yaml"


def decoding_from(path: str | Path | None) -> dict[str, Any]:
    """The ``decoding:`` settings of a decoding sweep's ``best_decoding.yaml`` ({} for None).

    ``path`` is the file or the sweep directory holding it.

    Raises:
        FileNotFoundError: no such file.
        ValueError: the file has no ``decoding:`` mapping.
    """
    if not path:
        return {}
    file = Path(path) / BEST_DECODING if Path(path).is_dir() else Path(path)
    if not file.is_file():
        raise FileNotFoundError(
            f"decoding file {file} not found; give the {BEST_DECODING} of a decoding sweep "
            "(python evaluate.py -m ckpt_path=... split=validation decoding.beam_size=4,5,8) or "
            "its sweep directory"
        )
    from omegaconf import OmegaConf

    content = OmegaConf.to_container(OmegaConf.load(file))
    decoding = content.get("decoding") if isinstance(content, dict) else None
    if not isinstance(decoding, dict):
        raise ValueError(f"{file} has no 'decoding:' mapping; is it a {BEST_DECODING}?")
    return {str(k): v for k, v in decoding.items()}


def stored_data_config(loaded: LoadedModel) -> DataConfig | None:
    """The data config the checkpoint stores (``None`` if it stores none)."""
    if not loaded.data:
        return None
    try:
        return DataConfig.from_dict(loaded.data)
    except (TypeError, ValueError) as err:
        raise CheckpointError(f"{loaded.path} holds an invalid data config: {err}") from None


@dataclass(frozen=True)
class Candidate:
    """One hypothesis as text: its detokenized text, score and target tokens (subwords)."""

    text: str
    score: float
    tokens: list[str]


@dataclass(frozen=True)
class Translation:
    """The translation of one line: its n-best list, best first (one entry without n-best)."""

    source: str
    hypotheses: list[Candidate]

    @property
    def text(self) -> str:
        return self.hypotheses[0].text

    @property
    def score(self) -> float:
        return self.hypotheses[0].score


class Translator:
    """Batched translation with a loaded checkpoint (or an ensemble), through the decode loop.

    Sources are cut like the test split of training (:func:`source_limit` of the stored
    ``data.max_len`` and the model's ``max_len``) and batched like it (the stored
    ``data.eval_max_tokens`` is the default budget), so translating a test set gives the
    hypotheses evaluate.py and the trainer score.

    Args:
        loaded: the model and tokenizer (:func:`transformer_mt.checkpoint.load_model`), or
            several checkpoints sharing one tokenizer: an ensemble (the first one's stored
            decoding and data config are the defaults).
        search: default decoding options (beam_size 1 = greedy).
        max_tokens: padded source tokens per batch (default when neither bound is given: the
            checkpoint's ``data.eval_max_tokens``, else 4096).
        max_sentences: sentences per batch (instead of, or on top of, ``max_tokens``).
        engine: the :class:`~transformer_mt.inference.decode.Engine` (default: our torch
            search over the loaded model(s); :func:`~transformer_mt.inference.engine.open_engine`
            builds the others).
    """

    def __init__(
        self,
        loaded: LoadedModel | Sequence[LoadedModel],
        search: SearchConfig | None = None,
        max_tokens: int | None = None,
        max_sentences: int | None = None,
        *,
        engine: Engine | None = None,
    ) -> None:
        if max_tokens is not None and max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
        if max_sentences is not None and max_sentences < 1:
            raise ValueError(f"batch size in sentences must be >= 1, got {max_sentences}")
        models = [loaded] if isinstance(loaded, LoadedModel) else list(loaded)
        self.loaded, self.tokenizer = models[0], models[0].tokenizer
        self.engine = engine if engine is not None else TorchEngine.from_loaded(models)
        self.search = search or search_config(self.loaded.decoding)
        data = stored_data_config(self.loaded)
        if max_tokens is None and max_sentences is None:
            max_tokens = DEFAULT_MAX_TOKENS if data is None else data.eval_max_tokens
        self.max_tokens, self.max_sentences = max_tokens, max_sentences
        #: source ids kept per sentence: the rule of every decoding path
        model_max_len = min(m.config.max_len for m in models)
        self.limit = source_limit(None if data is None else data.max_len, model_max_len)
        tok = self.tokenizer
        self.collate = Collate(tok.pad_id, tok.bos_id, tok.eos_id, self.limit)

    @property
    def device(self) -> torch.device:
        return self.loaded.device

    def encode(self, lines: Sequence[str], where: str = "input") -> list[list[int]]:
        """Source ids per line (no ``<eos>``); over-long lines are cut with a warning."""
        ids = self.tokenizer.encode_src_batch([line.strip() for line in lines])
        limit = self.limit
        long_lines = [i for i, seq in enumerate(ids) if limit is not None and len(seq) > limit]
        for i in long_lines[:5]:
            log.warning(
                "%s line %d has %d tokens, more than the %d a sentence may have (data.max_len, "
                "or the model's max_len - 1): truncated",
                where,
                i + 1,
                len(ids[i]),
                limit,
            )
        if len(long_lines) > 5:
            log.warning("... %d long lines truncated in all", len(long_lines))
        return [seq[:limit] for seq in ids]

    def batches(
        self, ids: Sequence[Sequence[int]], targets: Sequence[Sequence[int]] | None = None
    ) -> Iterator[dict[str, Any]]:
        """Collated batches of ``ids`` (and ``targets``) in the order every decoding path uses.

        With targets (forced decoding), the budget counts the longer side of each pair.
        """
        limit = self.limit
        lengths = [(len(s) if limit is None else min(len(s), limit)) + 1 for s in ids]  # + <eos>
        if targets is not None:
            lengths = [max(n, len(t) + 1) for n, t in zip(lengths, targets)]
        for batch in decode_sampler(lengths, self.max_tokens, self.max_sentences):
            columns: dict[str, Any] = {"src_ids": [ids[i] for i in batch], "index": batch}
            if targets is not None:
                columns["tgt_ids"] = [targets[i] for i in batch]
            yield self.collate(columns)

    def decode_ids(
        self,
        ids: Sequence[Sequence[int]],
        search: SearchConfig | None = None,
        *,
        progress: bool = False,
    ) -> list[list[Hypothesis]]:
        """The n-best list of each source id list, in order (``search``: default the
        translator's). Empty sources give one empty hypothesis without running the model."""
        if not ids:
            return []
        with progress_bar(progress, len(ids)) as advance:
            return decode(self.engine, self.batches(ids), search or self.search, advance)

    def translate_ids(
        self, ids: Sequence[Sequence[int]], progress: bool = False
    ) -> list[list[int]]:
        """Output ids (no ``<bos>``, cut before ``<eos>``) of the best hypothesis, in order."""
        return best_tokens(self.decode_ids(ids, progress=progress))

    def translate_batch(
        self, lines: Sequence[str], search: SearchConfig | None = None, *, progress: bool = False
    ) -> list[Translation]:
        """Each line's :class:`Translation` (text, score and the ``search.nbest`` best), in order.

        ``search`` overrides the translator's default for this call (e.g. per request).
        """
        nbest_lists = self.decode_ids(self.encode(lines), search, progress=progress)
        flat = [h for hyps in nbest_lists for h in hyps]
        texts = iter(self.tokenizer.decode_hypotheses([h.tokens for h in flat]))
        vocab = self.tokenizer.tgt
        return [
            Translation(
                line,
                [
                    Candidate(next(texts), h.score, [vocab.id_to_token(t) for t in h.tokens])
                    for h in hyps
                ],
            )
            for line, hyps in zip(lines, nbest_lists)
        ]

    def translate(self, lines: Sequence[str], progress: bool = False) -> list[str]:
        """One translation per line, in order; never a line break inside a translation."""
        return self.tokenizer.decode_hypotheses(self.translate_ids(self.encode(lines), progress))

    def score_ids(
        self,
        sources: Sequence[Sequence[int]],
        targets: Sequence[Sequence[int]],
        *,
        progress: bool = False,
    ) -> list[list[float]]:
        """Log-probability of each target token (``<eos>`` last) given its source, in order.

        Forced decoding, batched like translation; sources are cut to :attr:`limit` by the
        collate, targets must fit the model (at most ``max_len - 1`` ids).
        """
        with progress_bar(progress, len(sources), "scoring") as advance:
            return score(self.engine, self.batches(sources, targets), advance)

    def log_probs(
        self, sources: Sequence[Sequence[int]], outputs: Sequence[Sequence[int]]
    ) -> list[float]:
        """Model log-probability of each output (``<eos>`` included) given its source."""
        return [sum(token_scores) for token_scores in self.score_ids(sources, outputs)]


# ----------------------------------------------------------------------------- command line


def _chunks(lines: Iterable[str], size: int) -> Iterator[list[str]]:
    chunk: list[str] = []
    for line in lines:
        chunk.append(line)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def add_errors_argument(parser: argparse.ArgumentParser) -> None:
    """``--errors``: how every command that reads text treats bytes that are not UTF-8."""
    parser.add_argument(
        "--errors",
        choices=TEXT_ERRORS,
        default="strict",
        help="input bytes that are not UTF-8: strict (refuse, naming the line) or replace "
        "(read them as U+FFFD, with a warning that counts the lines)",
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
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:1, mps")
    parser.add_argument("--progress", action="store_true", help="show a progress bar on stderr")
    parser.add_argument("-q", "--quiet", action="store_true", help="only errors on stderr")
    parser.add_argument(
        "--engine", choices=("torch", "ctranslate2"), default="torch", help="decoding engine"
    )
    parser.add_argument("--ct2-model", help="CTranslate2 dir of transformer-mt-export (optional)")
    parser.add_argument("--compute-type", help="CTranslate2 weights: int8, float32, ...")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="transformer-mt-translate",
        description=(
            "Translate text with a transformer-mt checkpoint: one output line per input line, "
            "in order (empty lines stay empty). Decoding options default to those stored in "
            "the checkpoint."
        ),
        epilog="example: transformer-mt-translate --ckpt run/checkpoints/last.ckpt < in.en > out.de",
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
        help="write the K best hypotheses of each line (K <= beam size) as "
        "index<TAB>rank<TAB>score<TAB>translation lines (index from 0, rank from 1)",
    )
    parser.add_argument(
        "--format",
        choices=("text", "jsonl"),
        default="text",
        help='jsonl: one {"index", "source", "hypotheses": [{"text", "score", "tokens"}]} '
        "object per input line",
    )
    parser.add_argument(
        "--buffer-size",
        type=int,
        default=10000,
        help="lines read, sorted and translated at a time (default 10000)",
    )
    add_errors_argument(parser)
    return parser


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
    """stdout, or the file written through a temporary file and renamed when complete.

    A failed or interrupted run therefore leaves an existing output file as it was.
    """
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


#: The Hydra key of a shared message -> this command's flag, so that a fix is typed as given.
_FLAGS = {
    "decoding.beam_size=": "--beam-size ",
    "max_len_a=": "--max-len-a ",
    "max_len_b=": "--max-len-b ",
    "device=": "--device ",
}


def in_flag_syntax(message: str) -> str:
    """``message`` with evaluate.py's ``key=value`` fixes written as this command's flags."""
    for key, flag in _FLAGS.items():
        message = re.sub(rf"(?<![\w.]){re.escape(key)}", flag, message)
    return message


def open_translator(args: argparse.Namespace) -> Translator:
    """Load ``args.ckpt`` (one or an ensemble) and its engine, as the command line asks.

    Raises:
        ValueError: CTranslate2 options without ``--engine ctranslate2``, or an engine that
            cannot decode these checkpoints.
    """
    from transformer_mt.inference.engine import open_engine

    for flag, value in (("--ct2-model", args.ct2_model), ("--compute-type", args.compute_type)):
        if value is not None and args.engine != "ctranslate2":
            raise ValueError(f"{flag} applies to --engine ctranslate2 only; add it")
    device = resolve_device(args.device)
    loaded = [load_model(path, device) for path in args.ckpt]
    engine = open_engine(
        args.engine, loaded, ct2_model=args.ct2_model, compute_type=args.compute_type
    )
    return Translator(loaded, None, args.max_tokens, args.batch_size, engine=engine)


def _open_translator(args: argparse.Namespace) -> tuple[Translator, SearchConfig]:
    """The translator and search the options ask for; refuses unsafe paths before loading."""
    check_outputs_apart(
        [("--output", args.output)],
        [
            ("--input", args.input),
            *(("--ckpt", c) for c in args.ckpt),
            ("--ct2-model", args.ct2_model),
        ],
    )
    check_output_file(args.output, "--output")
    _check_input_text(args.input, args.errors)
    if args.buffer_size < 1:
        raise ValueError(f"--buffer-size must be >= 1, got {args.buffer_size}")
    try:
        translator = open_translator(args)
        search = search_config(
            {**(translator.loaded.decoding or {}), **decoding_from(args.decoding_from)},
            beam_size=1 if args.greedy else args.beam_size,
            length_penalty=args.length_penalty,
            length_norm=args.length_norm,
            max_len_a=args.max_len_a,
            max_len_b=args.max_len_b,
            nbest=args.nbest,
        )
    except ValueError as err:
        raise type(err)(in_flag_syntax(str(err))) from None
    return translator, search


def format_translation(translation: Translation, index: int, args: argparse.Namespace) -> str:
    """The output lines of one input line: text, n-best TSV or a JSON object."""
    if args.format == "jsonl":
        hyps = [
            {"text": h.text, "score": round(h.score, 6), "tokens": h.tokens}
            for h in translation.hypotheses
        ]
        record = {"index": index, "source": translation.source, "hypotheses": hyps}
        return json.dumps(record, ensure_ascii=False) + "\n"
    if args.nbest is None:
        return translation.text + "\n"
    return "".join(
        f"{index}\t{rank}\t{h.score:.4f}\t{h.text}\n"
        for rank, h in enumerate(translation.hypotheses, start=1)
    )


def configure_logging(quiet: bool) -> None:
    logging.basicConfig(
        level=logging.ERROR if quiet else logging.WARNING,
        format="%(levelname)s: %(message)s",
        stream=sys.stderr,
    )


def user_error(err: BaseException) -> int:
    """Print the one ``error:`` line of a user mistake; the exit status for it."""
    from transformer_mt.errors import EXIT_USER_ERROR, one_line

    print(f"error: {one_line(err)}", file=sys.stderr)
    return EXIT_USER_ERROR


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point; returns the exit status.

    A user error (missing or unsafe checkpoint, bad option, input that is not UTF-8, an
    output that would overwrite an input) is one ``error:`` line on stderr and status 2, as
    for train.py and evaluate.py (transformer_mt.errors); Ctrl-C gives 130.
    """
    args = build_parser().parse_args(argv)
    configure_logging(args.quiet)
    try:
        translator, search = _open_translator(args)
        source = _open_input(args.input)
    except (CheckpointError, ValueError, OSError) as err:
        return user_error(err)
    start, count, replaced = time.perf_counter(), 0, []
    lines = decode_lines(source, args.input, errors=args.errors, replaced=replaced, fix=ERRORS_FIX)
    try:
        with _open_output(args.output) as sink:
            for chunk in _chunks(lines, args.buffer_size):
                for translation in translator.translate_batch(
                    chunk, search, progress=args.progress
                ):
                    sink.write(format_translation(translation, count, args))
                    count += 1
                sink.flush()
    except KeyboardInterrupt:
        return 130
    except (ValueError, OSError) as err:  # bytes that are not UTF-8 on stdin, a full disk
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
