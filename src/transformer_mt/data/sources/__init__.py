"""Parallel corpora by source kind: the Hugging Face Hub, local files, or generated.

Every source returns a :class:`datasets.DatasetDict` with text columns ``src`` and ``tgt``
and (at least) the splits ``train``, ``validation`` and ``test``; nothing here tokenizes.
"""

from __future__ import annotations

from collections.abc import Iterator

import datasets

from transformer_mt.data.config import DataConfig
from transformer_mt.data.sources.files import direction_prefixes, iter_lines, load_files_corpus
from transformer_mt.data.sources.generated import generate_numbers_corpus
from transformer_mt.data.sources.hub import load_hub_corpus

__all__ = [
    "REQUIRED_SPLITS",
    "generate_numbers_corpus",
    "iter_texts",
    "load_corpus",
    "load_files_corpus",
    "load_hub_corpus",
    "with_train_targets",
]

REQUIRED_SPLITS = ("train", "validation", "test")


def load_corpus(config: DataConfig) -> datasets.DatasetDict:
    """Load the corpus ``config`` describes, as ``src``/``tgt`` text columns.

    With several ``data.directions`` each direction is loaded as its own corpus and the splits
    are concatenated, with a ``direction`` column (``"de-en"``) naming each row's.

    Raises:
        FileNotFoundError, ValueError, ConnectionError: with the path or value and the fix.
    """
    if config.multilingual:
        return _load_directions(config)
    return _load_one(config, config.src_lang, config.tgt_lang)


def with_train_targets(train: datasets.Dataset, config: DataConfig) -> datasets.Dataset:
    """The training sources with ``config.train_targets`` as their targets (beside the corpus's
    pairs with ``train_targets_mix``); ``train`` itself without that setting."""
    if not config.train_targets:
        return train
    lines = list(iter_lines(str(config.train_targets)))
    if len(lines) != len(train):
        raise ValueError(
            f"data.train_targets={config.train_targets} has {len(lines)} lines for "
            f"{len(train)} training pairs; it needs one target per training source, in order"
        )
    replaced = train.remove_columns("tgt").add_column("tgt", lines)
    return (
        datasets.concatenate_datasets([train, replaced]) if config.train_targets_mix else replaced
    )


def _load_directions(config: DataConfig) -> datasets.DatasetDict:
    parts: dict[str, list[datasets.Dataset]] = {}
    for src, tgt in config.pairs:
        corpus = _load_one(config, src, tgt)
        for split, data in corpus.items():
            column = [f"{src}-{tgt}"] * len(data)
            parts.setdefault(split, []).append(data.add_column("direction", column))
    missing = {s for s, p in parts.items() if len(p) != len(config.pairs)}
    if missing:
        raise ValueError(
            f"split(s) {sorted(missing)} exist for some directions only; every direction "
            "needs the same splits (data.prefixes / hub_splits)"
        )
    return datasets.DatasetDict(
        {split: datasets.concatenate_datasets(p) for split, p in parts.items()}
    )


def _load_one(config: DataConfig, src_lang: str, tgt_lang: str) -> datasets.DatasetDict:
    if config.source == "hub":
        corpus = load_hub_corpus(
            config.hub_id,
            config.hub_config,
            src_lang,
            tgt_lang,
            splits=config.hub_splits,
            revision=config.hub_revision,
        )
    elif config.source == "files":
        if config.dir is None:
            raise ValueError(
                "source=files needs a directory: set data.dir, e.g. "
                "data.dir=../shared/data/multi30k."
            )
        prefixes = config.prefixes
        if config.multilingual:
            prefixes = direction_prefixes(config.dir, prefixes, src_lang, tgt_lang)
        corpus = load_files_corpus(
            config.dir,
            src_lang,
            tgt_lang,
            prefixes=prefixes,
            file_format=config.file_format,
        )
    else:
        corpus = generate_numbers_corpus(
            src_lang=src_lang,
            tgt_lang=tgt_lang,
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


def iter_texts(
    split: datasets.Dataset, columns: tuple[str, ...], batch_size: int = 10000
) -> Iterator[list[str]]:
    """Yield batches of text from ``columns`` of ``split`` (for tokenizer training)."""
    for start in range(0, len(split), batch_size):
        rows = split[start : start + batch_size]
        for column in columns:
            yield rows[column]
