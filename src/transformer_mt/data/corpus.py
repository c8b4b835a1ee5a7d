"""Parallel corpora: the Hugging Face Hub, local files, or a generated task.

Every loader returns a :class:`datasets.DatasetDict` with two text columns,
``src`` and ``tgt``, and (at least) the splits ``train``, ``validation`` and
``test``. Nothing here tokenizes; lengths and filtering happen after
tokenization in :mod:`transformer_mt.data.datamodule`.

Three sources, selected by ``CorpusConfig.source``:

``hub``
    ``datasets.load_dataset(hub_id, hub_config)``. Both row layouts are
    understood: flat language columns (``bentrevett/multi30k``:
    ``{"en": ..., "de": ...}``) and the nested ``translation`` dict
    (``wmt14``, ``iwslt2017``). When the Hub cannot be reached we fail fast
    with one message that shows how to use local files instead.
``files``
    Line-aligned text ``{dir}/{prefix}.{lang}[.gz]`` (the Multi30k layout),
    or one file per split ``{dir}/{prefix}.tsv[.gz]`` (``src<TAB>tgt``) or
    ``{dir}/{prefix}.jsonl[.gz]`` (``{"src": .., "tgt": ..}`` or
    ``{"<src_lang>": .., "<tgt_lang>": ..}``).
``generated``
    English number words to German (or French) number words with
    ``num2words``: "four hundred and ninety-seven" ->
    "vierhundertsiebenundneunzig". Real language with reordering
    ("ninety-seven" -> "sieben-und-neunzig"), seeded, and small enough for a
    tiny Transformer to learn on a laptop CPU in minutes.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import logging
import os
import socket
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from itertools import zip_longest
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import datasets
import numpy as np

from transformer_mt.data.numbers import number_sentences

log = logging.getLogger(__name__)

_TEXT_FEATURES = datasets.Features(
    {"src": datasets.Value("string"), "tgt": datasets.Value("string")}
)

SOURCES = ("hub", "files", "generated")
FILE_FORMATS = ("auto", "parallel", "tsv", "jsonl")
REQUIRED_SPLITS = ("train", "validation", "test")

#: Multi30k file prefixes (github: multi30k/dataset, data/task1/raw).
DEFAULT_PREFIXES: dict[str, str] = {
    "train": "train",
    "validation": "val",
    "test": "test_2016_flickr",
}
DEFAULT_HUB_SPLITS: dict[str, str] = {
    "train": "train",
    "validation": "validation",
    "test": "test",
}
DEFAULT_SIZES: dict[str, int] = {"train": 20000, "validation": 500, "test": 500}

FILES_HINT = "python train.py data=multi30k data.source=files data.dir=../shared/data/multi30k"


@dataclass
class CorpusConfig:
    """Where a parallel corpus comes from; one field group per source.

    Attributes:
        source: ``"hub"``, ``"files"`` or ``"generated"``.
        src_lang: Source language code (``"en"``); names columns and files.
        tgt_lang: Target language code (``"de"``).
        hub_id: Dataset id on the Hub (``"bentrevett/multi30k"``, ``"wmt14"``).
        hub_config: Dataset config name (``"de-en"``, ``"iwslt2017-de-en"``).
        hub_splits: Our split name -> the Hub's split name.
        hub_revision: Git revision on the Hub; ``"refs/convert/parquet"``
            reads the Hub's Parquet export of an old script-based data set
            (``datasets`` >= 4 no longer runs loading scripts).
        dir: Directory of local files (``source="files"``).
        prefixes: Our split name -> file prefix in ``dir``. Any split named
            here is loaded, so ``test2017: test_2017_flickr`` adds a split.
        file_format: ``"parallel"`` ({prefix}.{lang}), ``"tsv"``, ``"jsonl"``
            or ``"auto"`` (whichever exists, in that order).
        sizes: Generated split sizes (``train``, ``validation``, ``test``).
        number_range: Generated numbers are drawn from ``[low, high]``.
        task: Generated task: ``"sentences"`` or ``"numbers"`` (bare number words).
        seed: Seed of the generated task.
        cache_dir: ``datasets`` cache directory for Hub downloads.
    """

    source: str = "generated"
    src_lang: str = "en"
    tgt_lang: str = "de"
    hub_id: str | None = None
    hub_config: str | None = None
    hub_splits: dict[str, str] = field(default_factory=lambda: dict(DEFAULT_HUB_SPLITS))
    hub_revision: str | None = None
    dir: str | None = None
    prefixes: dict[str, str] = field(default_factory=lambda: dict(DEFAULT_PREFIXES))
    file_format: str = "auto"
    sizes: dict[str, int] = field(default_factory=lambda: dict(DEFAULT_SIZES))
    number_range: tuple[int, int] = (0, 99999)
    task: str = "sentences"
    seed: int = 0
    cache_dir: str | None = None

    def __post_init__(self) -> None:
        if self.source not in SOURCES:
            raise ValueError(
                f"Unknown corpus source {self.source!r}; choose one of {SOURCES} "
                "(e.g. data.source=files)."
            )
        if self.file_format not in FILE_FORMATS:
            raise ValueError(
                f"Unknown file_format {self.file_format!r}; choose one of {FILE_FORMATS}."
            )
        if self.src_lang == self.tgt_lang:
            raise ValueError(
                f"src_lang and tgt_lang are both {self.src_lang!r}; set two different "
                "languages, e.g. data.src_lang=en data.tgt_lang=de."
            )
        # Hydra hands us DictConfig/ListConfig; keep plain containers.
        self.hub_splits = {str(k): str(v) for k, v in dict(self.hub_splits).items()}
        self.prefixes = {str(k): str(v) for k, v in dict(self.prefixes).items()}
        self.sizes = {str(k): int(v) for k, v in dict(self.sizes).items()}
        self.number_range = (int(self.number_range[0]), int(self.number_range[1]))


def load_corpus(config: CorpusConfig) -> datasets.DatasetDict:
    """Load the corpus ``config`` describes, as ``src``/``tgt`` text columns.

    Raises:
        FileNotFoundError, ValueError, ConnectionError: with the path or
            value at fault and how to fix it.
    """
    if config.source == "hub":
        corpus = load_hub_corpus(
            config.hub_id,
            config.hub_config,
            config.src_lang,
            config.tgt_lang,
            splits=config.hub_splits,
            revision=config.hub_revision,
            cache_dir=config.cache_dir,
        )
    elif config.source == "files":
        if config.dir is None:
            raise ValueError(
                "source=files needs a directory: set data.dir, e.g. "
                "data.dir=../shared/data/multi30k."
            )
        corpus = load_files_corpus(
            config.dir,
            config.src_lang,
            config.tgt_lang,
            prefixes=config.prefixes,
            file_format=config.file_format,
        )
    else:
        corpus = generate_numbers_corpus(
            src_lang=config.src_lang,
            tgt_lang=config.tgt_lang,
            sizes=config.sizes,
            number_range=config.number_range,
            seed=config.seed,
            task=config.task,
        )
    _check_splits(corpus, config.source)
    return corpus


def _check_splits(corpus: datasets.DatasetDict, where: str) -> None:
    missing = [s for s in REQUIRED_SPLITS if s not in corpus]
    if missing:
        raise ValueError(
            f"The {where} corpus has no split(s) {missing} (it has {sorted(corpus)}); "
            "map them in the config (hub_splits / prefixes / sizes)."
        )
    for name, split in corpus.items():
        if len(split) == 0:
            raise ValueError(
                f"Split {name!r} of the {where} corpus is empty; check its file or config."
            )


# --------------------------------------------------------------------------- hub


def _hub_offline() -> bool:
    """True when the user asked ``datasets``/``huggingface_hub`` not to go online."""
    truthy = {"1", "ON", "YES", "TRUE"}
    env = any(
        os.environ.get(var, "").upper() in truthy
        for var in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE")
    )
    return env or bool(datasets.config.HF_HUB_OFFLINE)


def _hub_reachable(timeout: float = 3.0) -> bool:
    """Can we open a TCP connection to the Hub endpoint? (A few ms when offline.)

    ``load_dataset`` retries for ~25 s before giving up; this probe fails in
    milliseconds. Behind a proxy a direct connection says nothing, so assume yes.
    """
    if any(os.environ.get(v) for v in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return True
    endpoint = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    host = endpoint.hostname or "huggingface.co"
    port = endpoint.port or (443 if endpoint.scheme == "https" else 80)
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def _hub_unreachable_message(hub_id: str, reason: str) -> str:
    if _hub_offline():  # offline mode is on already: the cache does not have it
        cache = "Offline mode is on and it is not in your datasets cache (or data.cache_dir). "
    else:
        cache = (
            "If it is already in your datasets cache, set HF_DATASETS_OFFLINE=1 to use the "
            "cached copy. "
        )
    return (
        f"Cannot load {hub_id!r} from the Hugging Face Hub: {reason}. {cache}"
        f"Otherwise read local files instead, e.g. `{FILES_HINT}` (see "
        "configs/data/files.yaml for the file layouts)."
    )


def load_hub_corpus(
    hub_id: str | None,
    hub_config: str | None,
    src_lang: str,
    tgt_lang: str,
    splits: Mapping[str, str] | None = None,
    revision: str | None = None,
    cache_dir: str | None = None,
) -> datasets.DatasetDict:
    """Load a translation data set from the Hugging Face Hub.

    Args:
        hub_id: Dataset id, e.g. ``"bentrevett/multi30k"`` or ``"wmt14"``.
        hub_config: Config name, e.g. ``"de-en"``; ``None`` if it has none.
        src_lang: Source language; a column name or a key of ``translation``.
        tgt_lang: Target language.
        splits: Our split name -> the Hub's split name.
        revision: Hub revision (branch, tag, commit or ``refs/convert/parquet``).
        cache_dir: ``datasets`` cache directory (``None``: the HF default).

    Raises:
        ConnectionError: the Hub cannot be reached (one message, with the fix).
        ValueError: the data set has neither the language columns nor
            ``translation``, or lacks a split.
    """
    if not hub_id:
        raise ValueError("source=hub needs a data set id: set data.hub_id, e.g. wmt14.")
    splits = dict(splits or DEFAULT_HUB_SPLITS)
    if not _hub_offline() and not _hub_reachable():
        raise ConnectionError(_hub_unreachable_message(hub_id, "no network connection"))
    try:
        raw = datasets.load_dataset(hub_id, hub_config, revision=revision, cache_dir=cache_dir)
    except (ConnectionError, OSError) as err:
        # ConnectionError covers OfflineModeIsEnabled and "Couldn't reach";
        # requests' exceptions are OSErrors. FileNotFoundError (an OSError)
        # means "not in the cache" when offline, "no such data set" online.
        if isinstance(err, FileNotFoundError) and not _hub_offline():
            raise
        raise ConnectionError(_hub_unreachable_message(hub_id, str(err))) from None
    except RuntimeError as err:
        if "scripts are no longer supported" not in str(err):
            raise
        raise ValueError(
            f"{hub_id!r} is a script-based data set, which datasets>=4 cannot run; read the "
            "Hub's Parquet export instead: data.hub_revision=refs/convert/parquet."
        ) from None

    if not isinstance(raw, datasets.DatasetDict):  # load_dataset without split= gives a dict
        raise ValueError(f"{hub_id!r} did not load as splits; got {type(raw).__name__}.")
    out = {}
    for ours, theirs in splits.items():
        if theirs not in raw:
            raise ValueError(
                f"{hub_id!r} ({hub_config}) has no split {theirs!r} (it has {sorted(raw)}); "
                f"fix data.hub_splits.{ours}."
            )
        out[ours] = _to_src_tgt(raw[theirs], src_lang, tgt_lang, f"{hub_id}:{theirs}")
    return datasets.DatasetDict(out)


def _to_src_tgt(
    split: datasets.Dataset, src_lang: str, tgt_lang: str, where: str
) -> datasets.Dataset:
    """Flatten either row layout into ``src``/``tgt`` string columns."""
    columns = split.column_names
    if src_lang in columns and tgt_lang in columns:
        split = split.select_columns([src_lang, tgt_lang])
        return split.rename_columns({src_lang: "src", tgt_lang: "tgt"})
    if "translation" in columns:
        pair = split.features["translation"]
        languages = getattr(pair, "languages", None) or list(getattr(pair, "keys", list)())
        if languages and (src_lang not in languages or tgt_lang not in languages):
            raise ValueError(
                f"{where} has languages {list(languages)}, not {src_lang}-{tgt_lang}; "
                "set data.src_lang/data.tgt_lang or pick another config."
            )

        def flatten(batch: dict[str, list[Any]]) -> dict[str, list[str]]:
            pairs = batch["translation"]
            return {"src": [p[src_lang] for p in pairs], "tgt": [p[tgt_lang] for p in pairs]}

        return split.map(flatten, batched=True, remove_columns=columns, desc=f"Flatten {where}")
    raise ValueError(
        f"{where} has columns {columns}; expected {src_lang!r} and {tgt_lang!r} "
        "or a 'translation' dict. Check data.src_lang/data.tgt_lang."
    )


# ------------------------------------------------------------------------- files


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
        raise ValueError(f"{path}: cannot read it after line {number} ({err}).") from None


def read_lines(path: str | os.PathLike[str]) -> list[str]:
    """Read a UTF-8 text file (plain or ``.gz``) into stripped lines (see :func:`iter_lines`)."""
    return list(iter_lines(path))


def _find(directory: Path, stem: str) -> Path | None:
    """``{stem}`` or ``{stem}.gz`` inside ``directory``, whichever exists."""
    for candidate in (directory / stem, directory / f"{stem}.gz"):
        if candidate.is_file():
            return candidate
    return None


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
    """Write streamed rows to an Arrow file in the ``datasets`` cache, memory-mapped.

    Only one writer batch is in memory at a time, so a 4.5M-pair corpus never sits in
    Python lists. ``from_generator`` caches by the generator and its arguments; the
    files' sizes and modification times are among them, so an edited file is re-read.
    Returns ``None`` when the files hold no rows.
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


def load_files_corpus(
    directory: str | os.PathLike[str],
    src_lang: str,
    tgt_lang: str,
    prefixes: Mapping[str, str] | None = None,
    file_format: str = "auto",
) -> datasets.DatasetDict:
    """Load local parallel text, one split per entry of ``prefixes``.

    Args:
        directory: Directory holding the files (relative to the current
            directory, which Hydra leaves at the project root).
        src_lang: Source language code, the ``{lang}`` of parallel files.
        tgt_lang: Target language code.
        prefixes: Split name -> file prefix. Defaults to Multi30k's
            ``train`` / ``val`` / ``test_2016_flickr``.
        file_format: ``"parallel"``, ``"tsv"``, ``"jsonl"`` or ``"auto"``.

    Raises:
        FileNotFoundError: the directory or a file is missing.
        ValueError: misaligned line counts, undecodable bytes, bad rows, or
            an empty split.
    """
    directory = Path(directory).expanduser()
    if not directory.is_dir():
        raise FileNotFoundError(
            f"Corpus directory not found: {directory} (absolute: {directory.absolute()}). "
            "Set data.dir to a directory of parallel text, e.g. data.dir=../shared/data/multi30k."
        )
    prefixes = dict(prefixes or DEFAULT_PREFIXES)
    out = {}
    for split, prefix in prefixes.items():
        fmt = file_format
        if fmt == "auto":
            fmt = "parallel"
            for candidate in ("tsv", "jsonl"):
                if _find(directory, f"{prefix}.{candidate}") is not None:
                    fmt = candidate
        if fmt == "parallel":
            paths = _parallel_paths(directory, prefix, src_lang, tgt_lang)
            split_data = _stream_to_arrow(
                _rows_parallel, {"src_path": str(paths[0]), "tgt_path": str(paths[1])}, paths
            )
            where = f"{directory / prefix}.{{{src_lang},{tgt_lang}}}"
        else:
            path = _find(directory, f"{prefix}.{fmt}")
            if path is None:
                raise FileNotFoundError(
                    f"Corpus file not found: {directory / f'{prefix}.{fmt}'}[.gz]; fix data.dir "
                    "or data.prefixes, or set data.file_format."
                )
            if fmt == "tsv":
                split_data = _stream_to_arrow(_rows_tsv, {"path": str(path)}, [path])
            else:
                kwargs = {"path": str(path), "src_lang": src_lang, "tgt_lang": tgt_lang}
                split_data = _stream_to_arrow(_rows_jsonl, kwargs, [path])
            where = str(path)
        if split_data is None or len(split_data) == 0:
            raise ValueError(
                f"Split {split!r} is empty: {where} has no lines; fill it, or point "
                f"data.prefixes.{split} at a non-empty file."
            )
        log.info("Read %d %s pairs from %s", len(split_data), split, where)
        out[split] = split_data
    return datasets.DatasetDict(out)


# --------------------------------------------------------------------- generated


def number_words(numbers: np.ndarray | list[int], lang: str) -> list[str]:
    """Spell out integers in ``lang`` with ``num2words`` (cardinal numbers)."""
    from num2words import num2words

    try:
        return [num2words(int(n), lang=lang) for n in numbers]
    except NotImplementedError:
        raise ValueError(
            f"num2words cannot spell numbers in {lang!r}; pick e.g. en, de or fr."
        ) from None


def generate_numbers_corpus(
    src_lang: str = "en",
    tgt_lang: str = "de",
    sizes: Mapping[str, int] | None = None,
    number_range: tuple[int, int] = (0, 99999),
    seed: int = 0,
    task: str = "sentences",
) -> datasets.DatasetDict:
    """Sentences with numbers (``task="sentences"``) or bare number words (``"numbers"``).

    ``"sentences"`` builds one template sentence per number (see
    :mod:`transformer_mt.data.numbers`); ``"numbers"`` pairs the number words alone.

    Numbers are drawn without replacement from ``number_range`` (inclusive),
    so every split holds different numbers: validation and test measure
    generalisation to unseen numbers, not recall. Deterministic per ``seed``.

    Raises:
        ValueError: the splits need more distinct numbers than the range has.
    """
    sizes = {k: int(v) for k, v in dict(sizes or DEFAULT_SIZES).items()}
    low, high = int(number_range[0]), int(number_range[1])
    available = high - low + 1
    total = sum(sizes.values())
    if any(v <= 0 for v in sizes.values()):
        raise ValueError(f"Generated split sizes must be positive, got {sizes}.")
    if total > available:
        raise ValueError(
            f"Generated splits need {total} distinct numbers {sizes} but the range "
            f"[{low}, {high}] has {available}; widen data.number_range or shrink data.sizes."
        )
    if task not in ("sentences", "numbers"):
        raise ValueError(f"Unknown generated task {task!r}; use data.task=sentences or numbers.")
    rng = np.random.default_rng(seed)
    numbers = low + rng.choice(available, size=total, replace=False)
    out, start = {}, 0
    for split, size in sizes.items():
        chosen = numbers[start : start + size]
        start += size
        if task == "sentences":
            src, tgt = number_sentences(chosen, src_lang, tgt_lang, seed=seed * 7919 + start)
        else:
            src, tgt = number_words(chosen, src_lang), number_words(chosen, tgt_lang)
        out[split] = datasets.Dataset.from_dict({"src": src, "tgt": tgt})
    log.info(
        "Generated %s number-word pairs %s->%s from [%d, %d] (seed %d)",
        sizes,
        src_lang,
        tgt_lang,
        low,
        high,
        seed,
    )
    return datasets.DatasetDict(out)


def iter_texts(
    split: datasets.Dataset, columns: tuple[str, ...], batch_size: int = 10000
) -> Iterator[list[str]]:
    """Yield batches of text from ``columns`` of ``split`` (for tokenizer training)."""
    for start in range(0, len(split), batch_size):
        rows = split[start : start + batch_size]
        for column in columns:
            yield rows[column]
