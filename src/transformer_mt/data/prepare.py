"""Corpus -> BPE -> token ids, without Lightning: what the data module and evaluate.py share.

:func:`prepare` loads the corpus, trains (or reuses) the BPE tokenizer on the training split,
tokenizes every split (a memory-mapped Arrow file with ``cache_dir``) and drops empty or
over-long training pairs; validation/test stay complete for BLEU and are cut when batched.
:func:`decode_loader` batches a split for decoding (validation, test, evaluate.py).
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import torch
from torch.utils.data import DataLoader

from transformer_mt.data.batching import decode_sampler
from transformer_mt.data.collate import Collate, TokenizedSplit
from transformer_mt.data.config import DataConfig
from transformer_mt.data.directions import tag, target_languages
from transformer_mt.data.sources import iter_texts, load_corpus, with_train_targets
from transformer_mt.data.tokenizer import FILENAME, Tokenizer

log = logging.getLogger(__name__)

_CACHE_VERSION = "1"  # bump when the tokenized layout changes
_ID_FEATURES = datasets.Features(
    {
        "src": datasets.Value("string"),
        "tgt": datasets.Value("string"),
        "src_ids": datasets.List(datasets.Value("int32")),
        "tgt_ids": datasets.List(datasets.Value("int32")),
        "src_len": datasets.Value("int32"),
        "tgt_len": datasets.Value("int32"),
        "index": datasets.Value("int64"),
    }
)


def _features(split: datasets.Dataset) -> datasets.Features:
    """The tokenized columns, with the ``direction`` of a multilingual corpus kept."""
    if "direction" not in split.column_names:
        return _ID_FEATURES
    return datasets.Features({**_ID_FEATURES, "direction": datasets.Value("string")})


@dataclass
class PreparedData:
    """Tokenized splits and the tokenizer that made them.

    ``lengths[name]``: each row's id counts ``(src_len, tgt_len)``, specials excluded, before
    any cut; ``available_splits``: every split of the corpus, tokenized or not.
    """

    config: DataConfig
    tokenizer: Tokenizer
    splits: dict[str, datasets.Dataset] = field(default_factory=dict)
    lengths: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    available_splits: list[str] = field(default_factory=list)


class _Encode:
    """``datasets.map`` function: ids, lengths and row index (picklable for num_proc)."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer

    def __call__(self, batch: dict[str, list[str]], indices: list[int]) -> dict[str, list[Any]]:
        src_ids = self.tokenizer.encode_src_batch(batch["src"])
        tgt_ids = self.tokenizer.encode_tgt_batch(batch["tgt"])
        if "direction" in batch:  # several directions: the target language's tag leads
            tags = {}
            for d in set(batch["direction"]):
                tags[d] = self.tokenizer.tag_id(d.split("-", 1)[1])
                if tags[d] is None:
                    raise ValueError(f"the tokenizer has no target tag for direction {d}")
            src_ids = [[tags[d], *ids] for d, ids in zip(batch["direction"], src_ids)]
        return {
            "src_ids": src_ids,
            "tgt_ids": tgt_ids,
            "src_len": [len(ids) for ids in src_ids],
            "tgt_len": [len(ids) for ids in tgt_ids],
            "index": list(indices),
        }


def prepare(
    config: DataConfig,
    tokenizer: Tokenizer | None = None,
    work_dir: str | Path | None = None,
    only_splits: Sequence[str] | None = None,
) -> PreparedData:
    """Load, tokenize and filter the corpus ``config`` describes.

    Args:
        tokenizer: A ready tokenizer (e.g. from a checkpoint) instead of training one; its
            languages must match.
        work_dir: Run directory: ``tokenizer.json`` is written to (and reused from) here.
        only_splits: Tokenize just these splits (needs a ready ``tokenizer``). ``None``: all.

    Raises:
        ValueError, FileNotFoundError, ConnectionError: bad data or settings, with the fix.
    """
    if only_splits is not None and tokenizer is None:
        raise ValueError("only_splits needs a ready tokenizer (training one needs 'train').")
    if tokenizer is not None:
        check_languages(tokenizer, config, "the tokenizer passed in")
    cache_dir = None if config.cache_dir is None else Path(config.cache_dir)
    corpus = _load_corpus(config, cache_dir)
    if only_splits is None or "train" in only_splits:  # evaluation never reads the targets
        corpus["train"] = with_train_targets(corpus["train"], config)
    if tokenizer is None:
        path = None if work_dir is None else Path(work_dir) / FILENAME
        tokenizer = _load_or_train_tokenizer(config, corpus["train"], path)
    data = PreparedData(config, tokenizer, available_splits=sorted(corpus))
    wanted = None if only_splits is None else {str(s) for s in only_splits}
    for name, split in corpus.items():
        if wanted is not None and name not in wanted:
            continue
        tokenized = _tokenize(name, split, tokenizer, config, cache_dir)
        lengths = tokenized.with_format("numpy", columns=["src_len", "tgt_len"])[:]
        src_len = lengths["src_len"].astype(np.int64)
        tgt_len = lengths["tgt_len"].astype(np.int64)
        if name == "train":
            tokenized, src_len, tgt_len = _filter_train(tokenized, src_len, tgt_len, config)
        else:
            _report_truncation(name, src_len, tgt_len, config.max_len)
        data.splits[name] = tokenized
        data.lengths[name] = (src_len, tgt_len)
    return data


def decode_loader(
    data: PreparedData,
    name: str,
    limit: int | None,
    *,
    max_tokens: int | None = None,
    max_sentences: int | None = None,
    rank: int = 0,
    world_size: int = 1,
) -> DataLoader:
    """Batches of split ``name`` for decoding: sorted by source length, source-token budget.

    Args:
        limit: Source ids kept per sentence (:func:`~transformer_mt.data.collate.source_limit`).
        max_tokens: Padded source tokens per batch (default, when ``max_sentences`` is not
            given either: ``data.eval_max_tokens``).
        max_sentences: Sentences per batch, instead of or on top of ``max_tokens``.
    """
    if name not in data.splits:
        raise ValueError(f"No split {name!r}; available: {sorted(data.splits)}.")
    src_len = data.lengths[name][0]
    tensor_len = (src_len if limit is None else np.minimum(src_len, limit)) + 1  # + <eos>
    if max_tokens is None and max_sentences is None:
        max_tokens = data.config.eval_max_tokens
    tok = data.tokenizer
    return DataLoader(
        TokenizedSplit(data.splits[name]),
        batch_sampler=decode_sampler(tensor_len, max_tokens, max_sentences, rank, world_size),
        collate_fn=Collate(tok.pad_id, tok.bos_id, tok.eos_id, limit),
        num_workers=data.config.num_workers,
        persistent_workers=data.config.num_workers > 0,
        # Its own generator: the global RNG (dropout's) stays as a resume replays it.
        generator=torch.Generator().manual_seed(data.config.seed),
    )


def check_languages(tokenizer: Tokenizer, config: DataConfig, where: str) -> None:
    """The tokenizer's languages must be the data's."""
    for side, have, want in (
        ("source", tokenizer.src_lang, config.src_lang),
        ("target", tokenizer.tgt_lang, config.tgt_lang),
    ):
        if have is not None and have != want:
            raise ValueError(
                f"The {side} language of {where} is {have!r} but the data is {want!r}; "
                f"use a tokenizer trained for {config.src_lang}->{config.tgt_lang} "
                "(or a fresh run directory)."
            )


def _load_corpus(config: DataConfig, cache_dir: Path | None) -> datasets.DatasetDict:
    """Load the corpus; a generated one is kept in ``cache_dir`` (num2words is slow)."""
    if config.source != "generated" or cache_dir is None:
        return load_corpus(config)
    generator = {
        k: getattr(config, k)
        for k in ("source", "src_lang", "tgt_lang", "sizes", "number_range", "task", "seed")
    }
    key = json.dumps([_CACHE_VERSION, generator], sort_keys=True, default=str)
    path = cache_dir / f"numbers-{hashlib.sha256(key.encode()).hexdigest()[:20]}"
    if (path / "dataset_dict.json").is_file():
        log.info("Loading the generated corpus from %s", path)
        return datasets.load_from_disk(str(path))
    corpus = load_corpus(config)
    with _no_progress_bars():  # a copy of what was just generated: nothing to watch
        corpus.save_to_disk(str(path))
    log.info("Kept the generated corpus in %s", path)
    return datasets.load_from_disk(str(path))  # memory-mapped, same as a later run


@contextlib.contextmanager
def _no_progress_bars() -> Iterator[None]:
    """``datasets``' progress bars off inside the block, as they were after it."""
    from datasets.utils import logging as datasets_logging

    was_on = datasets_logging.is_progress_bar_enabled()
    datasets_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_on:
            datasets_logging.enable_progress_bar()


def _tokenizer_texts(config: DataConfig, train: datasets.Dataset) -> tuple[Any, Any]:
    """The text the BPE learns from: both sides of the training split; with several
    directions each language's text once, not once per direction."""
    if not config.multilingual:
        return iter_texts(train, ("src",)), iter_texts(train, ("tgt",))
    if not config.joint_vocab:
        raise ValueError(
            "data.directions needs one joint vocabulary for all its languages; "
            "set data.joint_vocab=true"
        )
    texts: list[Any] = []
    seen: set[str] = set()
    directions = train["direction"]
    for src, tgt in config.pairs:
        for lang, column in ((src, "src"), (tgt, "tgt")):
            if lang in seen:
                continue
            seen.add(lang)
            rows = [i for i, d in enumerate(directions) if d == f"{src}-{tgt}"]
            texts.append(iter_texts(train.select(rows), (column,)))
    return itertools.chain.from_iterable(texts), iter([])


def _load_or_train_tokenizer(
    config: DataConfig, train: datasets.Dataset, path: Path | None
) -> Tokenizer:
    wanted: dict[str, Any] = {
        "vocab_size": config.vocab_size,
        "min_frequency": config.min_frequency,
        "joint": config.joint_vocab,
    }
    if config.multilingual:
        wanted["tags"] = [tag(lang) for lang in target_languages(config.pairs)]
    if path is not None and path.is_file():
        tokenizer = Tokenizer.load(path)
        check_languages(tokenizer, config, str(path))
        if tokenizer.config and tokenizer.config != wanted:
            raise ValueError(
                f"{path} was trained with {tokenizer.config}, but the config asks for "
                f"{wanted}; delete it to retrain, or use a fresh run directory."
            )
        log.info("Reusing the tokenizer in %s (%r)", path, tokenizer)
        return tokenizer
    src_texts, tgt_texts = _tokenizer_texts(config, train)
    tokenizer = Tokenizer.train(
        src_texts,
        tgt_texts,
        vocab_size=config.vocab_size,
        joint=config.joint_vocab,
        min_frequency=config.min_frequency,
        src_lang=config.src_lang,
        tgt_lang=config.tgt_lang,
    )
    if config.multilingual:
        tokenizer.add_target_tags(target_languages(config.pairs))
    if path is not None:
        tokenizer.save(path.parent)
        log.info("Saved the tokenizer to %s", path)
    return tokenizer


def _tokenize(
    name: str,
    split: datasets.Dataset,
    tokenizer: Tokenizer,
    config: DataConfig,
    cache_dir: Path | None,
) -> datasets.Dataset:
    cache_file = None
    if cache_dir is not None:
        # Content-addressed: a changed corpus or tokenizer never reads a stale file.
        digest = hashlib.sha256(
            f"{_CACHE_VERSION}|{split._fingerprint}|{tokenizer.to_json()}".encode()
        ).hexdigest()[:20]
        cache_dir.mkdir(parents=True, exist_ok=True)
        cache_file = str(cache_dir / f"{name}-{digest}.arrow")
    return split.map(
        _Encode(tokenizer),
        batched=True,
        batch_size=1000,
        with_indices=True,
        num_proc=config.num_proc if config.num_proc > 1 and len(split) > 10000 else None,
        features=_features(split),
        cache_file_name=cache_file,
        load_from_cache_file=cache_file is not None,
        keep_in_memory=cache_file is None,
        new_fingerprint=None if cache_file is None else Path(cache_file).stem,
        desc=f"Tokenize {name}",
    )


def _filter_train(
    split: datasets.Dataset, src_len: np.ndarray, tgt_len: np.ndarray, config: DataConfig
) -> tuple[datasets.Dataset, np.ndarray, np.ndarray]:
    max_len = config.max_len
    empty = (src_len == 0) | (tgt_len == 0)
    too_long = ~empty & ((src_len > max_len) | (tgt_len > max_len))
    keep = np.flatnonzero(~(empty | too_long))
    if len(keep) == 0:
        raise ValueError(
            f"All {len(split)} training pairs were filtered out ({int(empty.sum())} empty, "
            f"{int(too_long.sum())} longer than max_len={max_len} tokens); check the "
            "training files or raise data.max_len."
        )
    if len(keep) < len(split):
        log.warning(
            "Dropped %d of %d training pairs: %d empty, %d longer than max_len=%d tokens",
            len(split) - len(keep),
            len(split),
            int(empty.sum()),
            int(too_long.sum()),
            max_len,
        )
        split = split.select(keep)
    return split, src_len[keep], tgt_len[keep]


def _report_truncation(name: str, src_len: np.ndarray, tgt_len: np.ndarray, max_len: int) -> None:
    long_src = int((src_len > max_len).sum())
    long_tgt = int((tgt_len > max_len).sum())
    empty = int(((src_len == 0) | (tgt_len == 0)).sum())
    if long_src or long_tgt:
        log.warning(
            "%s: truncated %d sources and %d target id sequences longer than max_len=%d "
            "(references stay complete for BLEU)",
            name,
            long_src,
            long_tgt,
            max_len,
        )
    if empty:
        log.info("%s: %d pairs with an empty side are kept (eval sets stay complete)", name, empty)
