"""The ``files`` source: local parallel text, streamed into memory-mapped Arrow files.

Layouts (UTF-8, each optionally ``.gz``), one file set per split prefix:

- ``parallel``: ``{dir}/{prefix}.{src_lang}`` + ``{dir}/{prefix}.{tgt_lang}``, line-aligned
  (the Multi30k layout);
- ``tsv``: ``{dir}/{prefix}.tsv``, ``src<TAB>tgt``;
- ``jsonl``: ``{dir}/{prefix}.jsonl``, ``{"src": .., "tgt": ..}`` or
  ``{"<src_lang>": .., "<tgt_lang>": ..}``;
- ``auto``: tsv, then jsonl, else parallel, per split.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import logging
import os
from collections.abc import Iterator, Mapping
from itertools import zip_longest
from pathlib import Path
from typing import Any

import datasets

from transformer_mt.data.config import DEFAULT_PREFIXES

log = logging.getLogger(__name__)

_TEXT_FEATURES = datasets.Features(
    {"src": datasets.Value("string"), "tgt": datasets.Value("string")}
)


def _open_binary(path: Path) -> Any:
    return gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")


def iter_lines(path: str | os.PathLike[str]) -> Iterator[str]:
    """Stream the stripped lines of a UTF-8 text file (plain or ``.gz``), one at a time.

    Raises:
        FileNotFoundError: the file does not exist.
        ValueError: a line is not valid UTF-8 (names the file and line).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"Corpus file not found: {path}")
    number = 0
    try:
        with _open_binary(path) as handle:
            for raw in handle:
                number += 1
                try:
                    line = raw.decode("utf-8").strip()
                except UnicodeDecodeError as err:
                    raise ValueError(
                        f"{path}, line {number}: not valid UTF-8 ({err.reason} at "
                        f"byte {err.start} of the line); convert the file to UTF-8, e.g. "
                        "with iconv."
                    ) from None
                yield line
    except (OSError, EOFError) as err:  # gzip.BadGzipFile, truncated archives
        raise ValueError(
            f"{path}: cannot read it after line {number} ({err}); the file is truncated or "
            "corrupt: copy or download it again (gzip -t checks a .gz file)."
        ) from None


def _find(directory: Path, stem: str) -> Path | None:
    """``{stem}`` or ``{stem}.gz`` inside ``directory``, whichever exists."""
    for candidate in (directory / stem, directory / f"{stem}.gz"):
        if candidate.is_file():
            return candidate
    return None


def direction_prefixes(
    directory: str | os.PathLike[str], prefixes: Mapping[str, str], src_lang: str, tgt_lang: str
) -> dict[str, str]:
    """The file prefixes of one direction of several: ``{prefix}.{src}-{tgt}`` where a split
    has such files (fairseq's layout: a corpus per direction), else the shared prefix."""
    directory = Path(directory).expanduser()
    out = {}
    for split, prefix in prefixes.items():
        own = f"{prefix}.{src_lang}-{tgt_lang}"
        names = (f"{own}.{src_lang}", f"{own}.tsv", f"{own}.jsonl")
        out[split] = own if any(_find(directory, n) is not None for n in names) else prefix
    return out


def _parallel_paths(directory: Path, prefix: str, src_lang: str, tgt_lang: str) -> list[Path]:
    paths = []
    for lang in (src_lang, tgt_lang):
        path = _find(directory, f"{prefix}.{lang}")
        if path is None:
            raise FileNotFoundError(
                f"Corpus file not found: {directory / f'{prefix}.{lang}'}[.gz]. "
                f"Expected {{dir}}/{{prefix}}.{{lang}}[.gz]; fix data.dir, data.prefixes "
                f"or data.src_lang/tgt_lang. Files in {directory}: "
                f"{sorted(p.name for p in directory.iterdir())[:12]}"
            )
        paths.append(path)
    return paths


def _count_lines(path: Path) -> int:
    with _open_binary(path) as handle:
        return sum(1 for _ in handle)


def _rows_parallel(src_path: str, tgt_path: str) -> Iterator[dict[str, str]]:
    """Line pairs of two aligned files, streamed (``Dataset.from_generator`` input)."""
    src_lines, tgt_lines = iter_lines(src_path), iter_lines(tgt_path)
    for src, tgt in zip_longest(src_lines, tgt_lines):
        if src is None or tgt is None:
            counts = {p: _count_lines(Path(p)) for p in (src_path, tgt_path)}
            raise ValueError(
                f"Line counts differ: {src_path} has {counts[src_path]} lines, {tgt_path} has "
                f"{counts[tgt_path]}; parallel files must be line-aligned."
            )
        yield {"src": src, "tgt": tgt}


def _rows_tsv(path: str) -> Iterator[dict[str, str]]:
    for number, line in enumerate(iter_lines(path), start=1):
        fields = line.split("\t")
        if len(fields) != 2:
            raise ValueError(
                f"{path}, line {number}: expected 2 tab-separated fields (src<TAB>tgt), "
                f"found {len(fields)}."
            )
        yield {"src": fields[0].strip(), "tgt": fields[1].strip()}


def _rows_jsonl(path: str, src_lang: str, tgt_lang: str) -> Iterator[dict[str, str]]:
    for number, line in enumerate(iter_lines(path), start=1):
        if not line:
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}, line {number}: invalid JSON ({err.msg}).") from None
        for keys in (("src", "tgt"), (src_lang, tgt_lang)):
            if isinstance(row, dict) and keys[0] in row and keys[1] in row:
                yield {"src": str(row[keys[0]]).strip(), "tgt": str(row[keys[1]]).strip()}
                break
        else:
            found = sorted(row) if isinstance(row, dict) else type(row).__name__
            raise ValueError(
                f"{path}, line {number}: expected keys 'src'/'tgt' or "
                f"{src_lang!r}/{tgt_lang!r}, found {found}."
            )


def _stream_to_arrow(
    rows: Any, gen_kwargs: dict[str, Any], paths: list[Path]
) -> datasets.Dataset | None:
    """Write streamed rows to a memory-mapped Arrow file in the ``datasets`` cache (one
    writer batch in memory at a time); ``None`` when the files hold no rows.

    The cache key holds the files' sizes and modification times, so an edited file is re-read.
    """
    stamp = repr([(str(p.resolve()), p.stat().st_size, p.stat().st_mtime_ns) for p in paths])
    try:
        return datasets.Dataset.from_generator(
            rows,
            gen_kwargs=gen_kwargs,
            features=_TEXT_FEATURES,
            config_name=hashlib.sha256(stamp.encode()).hexdigest()[:16],
        )
    except datasets.exceptions.DatasetGenerationError as err:
        # Keep our own message (misaligned files, bad UTF-8) instead of the generic wrapper.
        cause = err.__cause__
        if isinstance(cause, (ValueError, FileNotFoundError)):
            raise cause from None
        raise
    except ValueError as err:
        if "corresponds to no data" in str(err):  # datasets' words for zero rows
            return None
        raise


def _missing_directory(directory: Path) -> str:
    """The message for a missing ``data.dir``: a relative path names the directory it meant."""
    text = f"Corpus directory not found: {directory} (absolute: {directory.absolute()}). "
    if not directory.is_absolute():
        return text + (
            f"A relative data.dir resolves against the current directory ({Path.cwd()}); run "
            "from the directory it is relative to, or set data.dir to an absolute path."
        )
    return text + "Set data.dir to a directory of parallel text, e.g. data.dir=/data/multi30k."


def _load_split(
    directory: Path, prefix: str, src_lang: str, tgt_lang: str, file_format: str
) -> tuple[datasets.Dataset | None, str]:
    """One split's pairs (``None`` when it has none) and where they were read from."""
    fmt = file_format
    if fmt == "auto":
        fmt = "parallel"
        for candidate in ("tsv", "jsonl"):
            if _find(directory, f"{prefix}.{candidate}") is not None:
                fmt = candidate
    if fmt == "parallel":
        paths = _parallel_paths(directory, prefix, src_lang, tgt_lang)
        rows = {"src_path": str(paths[0]), "tgt_path": str(paths[1])}
        return _stream_to_arrow(_rows_parallel, rows, paths), (
            f"{directory / prefix}.{{{src_lang},{tgt_lang}}}"
        )
    path = _find(directory, f"{prefix}.{fmt}")
    if path is None:
        raise FileNotFoundError(
            f"Corpus file not found: {directory / f'{prefix}.{fmt}'}[.gz]; fix data.dir "
            "or data.prefixes, or set data.file_format."
        )
    if fmt == "tsv":
        return _stream_to_arrow(_rows_tsv, {"path": str(path)}, [path]), str(path)
    kwargs = {"path": str(path), "src_lang": src_lang, "tgt_lang": tgt_lang}
    return _stream_to_arrow(_rows_jsonl, kwargs, [path]), str(path)


def load_files_corpus(
    directory: str | os.PathLike[str],
    src_lang: str,
    tgt_lang: str,
    prefixes: Mapping[str, str] | None = None,
    file_format: str = "auto",
) -> datasets.DatasetDict:
    """Load local parallel text, one split per entry of ``prefixes``.

    Args:
        prefixes: Split name -> file prefix (``data.prefixes``); default Multi30k's.
        file_format: ``"parallel"``, ``"tsv"``, ``"jsonl"`` or ``"auto"``.

    Raises:
        FileNotFoundError: the directory or a file is missing.
        ValueError: misaligned line counts, undecodable bytes, bad rows, or an empty split.
    """
    directory = Path(directory).expanduser()
    if not directory.is_dir():
        raise FileNotFoundError(_missing_directory(directory))
    out = {}
    for split, prefix in dict(prefixes or DEFAULT_PREFIXES).items():
        split_data, where = _load_split(directory, prefix, src_lang, tgt_lang, file_format)
        if split_data is None or len(split_data) == 0:
            raise ValueError(
                f"Split {split!r} is empty: {where} has no lines; fill it, or point "
                f"data.prefixes.{split} at a non-empty file."
            )
        log.info("Read %d %s pairs from %s", len(split_data), split, where)
        out[split] = split_data
    return datasets.DatasetDict(out)
