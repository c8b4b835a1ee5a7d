"""``TranslationDataModule``: corpus -> BPE -> token ids -> token-budget batches.

The pipeline, run once by :meth:`TranslationDataModule.setup`:

1. load the corpus (:mod:`.corpus`: Hub, local files or generated);
2. train a byte-level BPE tokenizer on the *training* split, or reuse
   ``work_dir/tokenizer.json`` when a previous run left one there;
3. tokenize every split with ``datasets.map`` (batched, ``num_proc``
   workers); with a ``cache_dir`` the result is an Arrow file that is
   memory-mapped, not held in Python lists, and reused by later runs;
4. filter training pairs that are empty or longer than ``max_len``
   (counts are logged); validation/test keep every sentence -- a test set
   must stay complete for BLEU -- and over-long ones are truncated;
5. batch by token budget (:mod:`.batching`).

Batches are dicts::

    src       LongTensor (B, S)  source ids + <eos>, padded with pad_id
    tgt       LongTensor (B, T)  <bos> + target ids + <eos>, padded with pad_id
                                 (the module uses tgt[:, :-1] -> tgt[:, 1:])
    index     LongTensor (B,)    row of each example in its split, so
                                 length-sorted eval output can be put back in
                                 corpus order
    src_text  list[str]          raw source sentences
    tgt_text  list[str]          raw reference sentences (for BLEU)

``max_len`` counts subword tokens, without ``<bos>``/``<eos>``.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import datasets
import lightning.pytorch as pl
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from transformer_mt.data.batching import TokenBudgetBatchSampler
from transformer_mt.data.corpus import CorpusConfig, iter_texts, load_corpus
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


class _Encode:
    """``datasets.map`` function: ids, lengths and row index (picklable for num_proc)."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer

    def __call__(self, batch: dict[str, list[str]], indices: list[int]) -> dict[str, list[Any]]:
        src_ids = self.tokenizer.encode_src_batch(batch["src"])
        tgt_ids = self.tokenizer.encode_tgt_batch(batch["tgt"])
        return {
            "src_ids": src_ids,
            "tgt_ids": tgt_ids,
            "src_len": [len(ids) for ids in src_ids],
            "tgt_len": [len(ids) for ids in tgt_ids],
            "index": list(indices),
        }


class TokenizedSplit(Dataset):
    """A tokenized split as a map-style dataset that fetches whole batches.

    ``DataLoader`` calls ``__getitems__`` with a batch of indices, so a batch
    is one Arrow read instead of ``B`` row look-ups.
    """

    def __init__(self, split: datasets.Dataset) -> None:
        self.split = split

    def __len__(self) -> int:
        return len(self.split)

    def __getitems__(self, indices: Sequence[int]) -> dict[str, list[Any]]:
        return self.split[list(indices)]

    def __getitem__(self, index: int) -> dict[str, list[Any]]:
        return self.__getitems__([index])


class Collate:
    """Column dict -> padded tensors (see the module docstring for the format).

    Args:
        pad_id, bos_id, eos_id: Special-token ids.
        max_len: Truncate longer id sequences to this many tokens (eval
            splits; training pairs over ``max_len`` were filtered already).
    """

    def __init__(self, pad_id: int, bos_id: int, eos_id: int, max_len: int) -> None:
        self.pad_id, self.bos_id, self.eos_id, self.max_len = pad_id, bos_id, eos_id, max_len

    def _pad(self, rows: list[list[int]], prefix: list[int]) -> torch.Tensor:
        rows = [prefix + list(ids[: self.max_len]) + [self.eos_id] for ids in rows]
        out = torch.full((len(rows), max(map(len, rows))), self.pad_id, dtype=torch.long)
        for i, ids in enumerate(rows):
            out[i, : len(ids)] = torch.as_tensor(ids, dtype=torch.long)
        return out

    def __call__(self, columns: Any) -> dict[str, Any]:
        """``columns``: the dict of lists ``TokenizedSplit.__getitems__`` returns."""
        return {
            "src": self._pad(columns["src_ids"], []),  # (B, S)
            "tgt": self._pad(columns["tgt_ids"], [self.bos_id]),  # (B, T)
            "index": torch.as_tensor(columns["index"], dtype=torch.long),  # (B,)
            "src_text": list(columns["src"]),
            "tgt_text": list(columns["tgt"]),
        }


def _batches_done(trainer: Any) -> int:
    """Training batches finished in the current epoch (as counted by Lightning's loop)."""
    return int(trainer.fit_loop.epoch_loop.batch_progress.current.processed)


class ResumableDataLoader(DataLoader):
    """A DataLoader whose position in the epoch is saved in checkpoints.

    Lightning stores ``state_dict()`` of a training loader in each checkpoint and calls
    ``load_state_dict()`` when resuming; the batch sampler then skips the batches the
    interrupted run had already trained on, so a run resumed from a mid-epoch checkpoint
    continues with the same data order as an uninterrupted one.
    """

    def __init__(self, *args: Any, progress: Any = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._progress = progress

    def state_dict(self) -> dict[str, int]:
        sampler = self.batch_sampler
        consumed = self._progress() if self._progress is not None else 0
        return {"epoch": int(getattr(sampler, "epoch", 0)), "consumed": consumed}

    def load_state_dict(self, state: dict[str, int]) -> None:
        sampler = self.batch_sampler
        if hasattr(sampler, "resume"):
            sampler.resume(state["epoch"], state["consumed"])


class TranslationDataModule(pl.LightningDataModule):
    """Parallel text for training, validation and test, batched by token budget.

    All arguments are plain values so a Hydra ``configs/data/*.yaml`` can
    instantiate it (``_target_: transformer_mt.data.datamodule.TranslationDataModule``).
    After :meth:`setup` it exposes ``tokenizer``, ``src_vocab_size``,
    ``tgt_vocab_size`` and ``pad_id``.

    Args:
        source: ``"generated"`` (number words), ``"files"`` or ``"hub"``.
        src_lang: Source language code.
        tgt_lang: Target language code.
        hub_id: Hub data set id (``source="hub"``).
        hub_config: Hub config name, e.g. ``"de-en"``.
        hub_splits: Split name -> Hub split name.
        hub_revision: Hub revision, e.g. ``refs/convert/parquet``.
        dir: Directory of local files (``source="files"``); relative paths
            resolve against the current directory (the project root).
        prefixes: Split name -> file prefix; extra entries add splits.
        file_format: ``"auto"``, ``"parallel"``, ``"tsv"`` or ``"jsonl"``.
        sizes: Generated split sizes.
        number_range: Generated numbers come from ``[low, high]``.
        task: Generated task: ``"sentences"`` (template sentences with numbers,
            see :mod:`transformer_mt.data.numbers`) or ``"numbers"`` (bare number words).
        vocab_size: BPE vocabulary size (each side if not joint).
        joint_vocab: One vocabulary for both languages (lets the model tie
            source and target embeddings) or one per side.
        min_frequency: Minimum count of a BPE merge.
        max_tokens: Training batch budget, padding included.
        eval_max_tokens: Evaluation batch budget (default: ``max_tokens``).
        max_len: Longest sentence in subword tokens. Longer training pairs
            are dropped; longer eval sentences are truncated.
        num_workers: DataLoader worker processes.
        num_proc: Processes for tokenizing with ``datasets.map``.
        seed: Seed of the generated corpus and of batch shuffling.
        cache_dir: Where tokenized Arrow files go (``None``: in memory).
        work_dir: Run directory; ``tokenizer.json`` is written to (and
            reused from) here. ``None``: the tokenizer is not saved.
        tokenizer: A ready tokenizer (e.g. from a checkpoint) to use instead
            of training one; its languages must match.
        name: A label for run names and logs (e.g. ``multi30k_en_de``).
        only_splits: Tokenize just these splits (with a ready ``tokenizer``;
            evaluation needs one split, not the training set). ``None``: all.
    """

    def __init__(
        self,
        source: str = "generated",
        src_lang: str = "en",
        tgt_lang: str = "de",
        hub_id: str | None = None,
        hub_config: str | None = None,
        hub_splits: Mapping[str, str] | None = None,
        hub_revision: str | None = None,
        dir: str | None = None,
        prefixes: Mapping[str, str] | None = None,
        file_format: str = "auto",
        sizes: Mapping[str, int] | None = None,
        number_range: Sequence[int] = (0, 99999),
        task: str = "sentences",
        vocab_size: int = 8000,
        joint_vocab: bool = True,
        min_frequency: int = 2,
        max_tokens: int = 4096,
        eval_max_tokens: int | None = None,
        max_len: int = 256,
        num_workers: int = 0,
        num_proc: int = 1,
        seed: int = 0,
        cache_dir: str | None = None,
        work_dir: str | None = None,
        tokenizer: Tokenizer | None = None,
        name: str | None = None,
        only_splits: Sequence[str] | None = None,
    ) -> None:
        super().__init__()
        corpus_kwargs: dict[str, Any] = {"file_format": file_format, "seed": int(seed)}
        if hub_splits is not None:
            corpus_kwargs["hub_splits"] = hub_splits
        if prefixes is not None:
            corpus_kwargs["prefixes"] = prefixes
        if sizes is not None:
            corpus_kwargs["sizes"] = sizes
        self.corpus_config = CorpusConfig(
            source=source,
            src_lang=src_lang,
            tgt_lang=tgt_lang,
            hub_id=hub_id,
            hub_config=hub_config,
            hub_revision=hub_revision,
            dir=None if dir is None else str(dir),
            number_range=(int(number_range[0]), int(number_range[1])),
            task=task,
            **corpus_kwargs,
        )
        if max_len < 1:
            raise ValueError(f"max_len must be at least 1, got {max_len}.")
        eval_max_tokens = max_tokens if eval_max_tokens is None else eval_max_tokens
        for key, value in (("max_tokens", max_tokens), ("eval_max_tokens", eval_max_tokens)):
            if value < max_len + 2:  # the longest tensor row is <bos> + max_len + <eos>
                raise ValueError(
                    f"{key}={value} cannot hold one sentence of max_len={max_len} "
                    f"(+2 special tokens); raise data.{key} or lower data.max_len."
                )
        self.name = name or f"{source}_{src_lang}_{tgt_lang}"
        self.src_lang, self.tgt_lang = src_lang, tgt_lang
        self.vocab_size = int(vocab_size)
        self.joint_vocab = bool(joint_vocab)
        self.min_frequency = int(min_frequency)
        self.max_tokens = int(max_tokens)
        self.eval_max_tokens = int(eval_max_tokens)
        self.max_len = int(max_len)
        self.num_workers = int(num_workers)
        self.num_proc = int(num_proc)
        self.seed = int(seed)
        self.cache_dir = None if cache_dir is None else Path(cache_dir)
        self.work_dir = None if work_dir is None else Path(work_dir)
        self.tokenizer: Tokenizer | None = tokenizer
        if tokenizer is not None:
            self._check_languages(tokenizer, "the tokenizer passed in")
        if only_splits is not None and tokenizer is None:
            raise ValueError("only_splits needs a ready tokenizer (training one needs 'train').")
        self.only_splits = None if only_splits is None else {str(s) for s in only_splits}
        self.splits: dict[str, datasets.Dataset] = {}
        #: Every split the corpus has (``splits`` holds the tokenized ones).
        self.available_splits: list[str] = []
        self._lengths: dict[str, tuple[np.ndarray, np.ndarray]] = {}

    # -------------------------------------------------------------- properties

    def _require_setup(self) -> Tokenizer:
        if self.tokenizer is None:
            raise RuntimeError("Call datamodule.setup() before using its tokenizer or loaders.")
        return self.tokenizer

    @property
    def src_vocab_size(self) -> int:
        return self._require_setup().src_vocab_size

    @property
    def tgt_vocab_size(self) -> int:
        return self._require_setup().tgt_vocab_size

    @property
    def pad_id(self) -> int:
        return self._require_setup().pad_id

    # ------------------------------------------------------------ preparation

    def prepare_data(self) -> None:
        """Download, train the tokenizer and tokenize (once per node, before setup)."""
        self._prepare()

    def setup(self, stage: str | None = None) -> None:
        """Build every split (a no-op when already built in this process)."""
        self._prepare()

    def _prepare(self) -> None:
        if self.splits:
            return
        corpus = self._load_corpus()
        self.available_splits = sorted(corpus)
        if self.tokenizer is None:
            self.tokenizer = self._load_or_train_tokenizer(corpus["train"])
        for name, split in corpus.items():
            if self.only_splits is not None and name not in self.only_splits:
                continue
            tokenized = self._tokenize(name, split)
            lengths = tokenized.with_format("numpy", columns=["src_len", "tgt_len"])[:]
            src_len = lengths["src_len"].astype(np.int64)
            tgt_len = lengths["tgt_len"].astype(np.int64)
            if name == "train":
                tokenized, src_len, tgt_len = self._filter_train(tokenized, src_len, tgt_len)
            else:
                self._report_truncation(name, src_len, tgt_len)
            self.splits[name] = tokenized
            # Tensor lengths: truncated to max_len, plus <eos> (src) or <bos>, <eos> (tgt).
            self._lengths[name] = (
                np.minimum(src_len, self.max_len) + 1,
                np.minimum(tgt_len, self.max_len) + 2,
            )

    def _load_corpus(self) -> datasets.DatasetDict:
        """Load the corpus; a generated one is kept in ``cache_dir`` (num2words is slow)."""
        config = self.corpus_config
        if config.source != "generated" or self.cache_dir is None:
            return load_corpus(config)
        key = json.dumps([_CACHE_VERSION, asdict(config)], sort_keys=True, default=str)
        path = self.cache_dir / f"numbers-{hashlib.sha256(key.encode()).hexdigest()[:20]}"
        if (path / "dataset_dict.json").is_file():
            log.info("Loading the generated corpus from %s", path)
            return datasets.load_from_disk(str(path))
        corpus = load_corpus(config)
        corpus.save_to_disk(str(path))
        return datasets.load_from_disk(str(path))  # memory-mapped, same as a later run

    def _check_languages(self, tokenizer: Tokenizer, where: str) -> None:
        for side, have, want in (
            ("source", tokenizer.src_lang, self.src_lang),
            ("target", tokenizer.tgt_lang, self.tgt_lang),
        ):
            if have is not None and have != want:
                raise ValueError(
                    f"The {side} language of {where} is {have!r} but the data is {want!r}; "
                    f"use a tokenizer trained for {self.src_lang}->{self.tgt_lang} "
                    "(or a fresh run directory)."
                )

    def _load_or_train_tokenizer(self, train: datasets.Dataset) -> Tokenizer:
        path = None if self.work_dir is None else self.work_dir / FILENAME
        wanted = {
            "vocab_size": self.vocab_size,
            "min_frequency": self.min_frequency,
            "joint": self.joint_vocab,
        }
        if path is not None and path.is_file():
            tokenizer = Tokenizer.load(path)
            self._check_languages(tokenizer, str(path))
            if tokenizer.config and tokenizer.config != wanted:
                raise ValueError(
                    f"{path} was trained with {tokenizer.config}, but the config asks for "
                    f"{wanted}; delete it to retrain, or use a fresh run directory."
                )
            log.info("Reusing the tokenizer in %s (%r)", path, tokenizer)
            return tokenizer
        tokenizer = Tokenizer.train(
            iter_texts(train, ("src",)),
            iter_texts(train, ("tgt",)),
            vocab_size=self.vocab_size,
            joint=self.joint_vocab,
            min_frequency=self.min_frequency,
            src_lang=self.src_lang,
            tgt_lang=self.tgt_lang,
        )
        if path is not None:
            tokenizer.save(path.parent)
            log.info("Saved the tokenizer to %s", path)
        return tokenizer

    def _tokenize(self, name: str, split: datasets.Dataset) -> datasets.Dataset:
        tokenizer = self._require_setup()
        cache_file = None
        if self.cache_dir is not None:
            # Content-addressed: the split's fingerprint hashes its text, so a
            # changed corpus or tokenizer never reads a stale file.
            digest = hashlib.sha256(
                f"{_CACHE_VERSION}|{split._fingerprint}|{tokenizer.to_json()}".encode()
            ).hexdigest()[:20]
            self.cache_dir.mkdir(parents=True, exist_ok=True)
            cache_file = str(self.cache_dir / f"{name}-{digest}.arrow")
        return split.map(
            _Encode(tokenizer),
            batched=True,
            batch_size=1000,
            with_indices=True,
            num_proc=self.num_proc if self.num_proc > 1 and len(split) > 10000 else None,
            features=_ID_FEATURES,
            cache_file_name=cache_file,
            load_from_cache_file=cache_file is not None,
            keep_in_memory=cache_file is None,
            new_fingerprint=None if cache_file is None else Path(cache_file).stem,
            desc=f"Tokenize {name}",
        )

    def _filter_train(
        self, split: datasets.Dataset, src_len: np.ndarray, tgt_len: np.ndarray
    ) -> tuple[datasets.Dataset, np.ndarray, np.ndarray]:
        empty = (src_len == 0) | (tgt_len == 0)
        too_long = ~empty & ((src_len > self.max_len) | (tgt_len > self.max_len))
        keep = np.flatnonzero(~(empty | too_long))
        if len(keep) == 0:
            raise ValueError(
                f"All {len(split)} training pairs were filtered out ({int(empty.sum())} empty, "
                f"{int(too_long.sum())} longer than max_len={self.max_len} tokens); check the "
                "training files or raise data.max_len."
            )
        if len(keep) < len(split):
            log.warning(
                "Dropped %d of %d training pairs: %d empty, %d longer than max_len=%d tokens",
                len(split) - len(keep),
                len(split),
                int(empty.sum()),
                int(too_long.sum()),
                self.max_len,
            )
            split = split.select(keep)
        return split, src_len[keep], tgt_len[keep]

    def _report_truncation(self, name: str, src_len: np.ndarray, tgt_len: np.ndarray) -> None:
        long_src = int((src_len > self.max_len).sum())
        long_tgt = int((tgt_len > self.max_len).sum())
        empty = int(((src_len == 0) | (tgt_len == 0)).sum())
        if long_src or long_tgt:
            log.warning(
                "%s: truncated %d sources and %d target id sequences longer than max_len=%d "
                "(references stay complete for BLEU)",
                name,
                long_src,
                long_tgt,
                self.max_len,
            )
        if empty:
            log.info(
                "%s: %d pairs with an empty side are kept (eval sets stay complete)", name, empty
            )

    # ------------------------------------------------------------- dataloaders

    def _rank_and_world(self) -> tuple[int, int]:
        trainer = self.trainer
        if trainer is None:
            return 0, 1
        return int(trainer.global_rank), int(trainer.world_size)

    def batch_sampler(
        self, split_name: str, shuffle: bool | None = None
    ) -> TokenBudgetBatchSampler:
        """The token-budget batch sampler of a split (training: shuffled)."""
        self._require_setup()
        if split_name not in self.splits:
            raise ValueError(f"No split {split_name!r}; available: {sorted(self.splits)}.")
        is_train = split_name == "train"
        rank, world = self._rank_and_world()
        src_len, tgt_len = self._lengths[split_name]
        return TokenBudgetBatchSampler(
            src_len,
            tgt_len,
            max_tokens=self.max_tokens if is_train else self.eval_max_tokens,
            shuffle=is_train if shuffle is None else shuffle,
            seed=self.seed,
            rank=rank,
            world_size=world,
        )

    def dataloader(self, split_name: str, shuffle: bool | None = None) -> DataLoader:
        """A DataLoader over any split (``train``, ``validation``, ``test`` or an extra one).

        Training batches are shuffled per epoch; other splits come in a fixed
        order sorted by length -- use ``batch["index"]`` to restore corpus order.
        """
        tokenizer = self._require_setup()
        sampler = self.batch_sampler(split_name, shuffle)
        return DataLoader(
            TokenizedSplit(self.splits[split_name]),
            batch_sampler=sampler,
            collate_fn=Collate(tokenizer.pad_id, tokenizer.bos_id, tokenizer.eos_id, self.max_len),
            num_workers=self.num_workers,
            persistent_workers=self.num_workers > 0,
            # Its own generator: creating an iterator then draws no number from the global RNG,
            # which dropout uses (so resuming from a checkpoint replays the same dropout masks).
            generator=torch.Generator().manual_seed(self.seed),
        )

    def train_dataloader(self) -> DataLoader:
        tokenizer = self._require_setup()
        trainer = self._trainer_or_none()
        return ResumableDataLoader(
            TokenizedSplit(self.splits["train"]),
            batch_sampler=self.batch_sampler("train"),
            collate_fn=Collate(tokenizer.pad_id, tokenizer.bos_id, tokenizer.eos_id, self.max_len),
            num_workers=self.num_workers,
            persistent_workers=self.num_workers > 0,
            # Its own generator: creating an iterator then draws no number from the global RNG,
            # which dropout uses (so resuming from a checkpoint replays the same dropout masks).
            generator=torch.Generator().manual_seed(self.seed),
            progress=(lambda: _batches_done(trainer)) if trainer is not None else None,
        )

    def _trainer_or_none(self) -> Any:
        try:
            return self.trainer
        except RuntimeError:
            return None

    def val_dataloader(self) -> DataLoader:
        return self.dataloader("validation")

    def test_dataloader(self) -> DataLoader:
        return self.dataloader("test")

    def predict_dataloader(self) -> DataLoader:
        return self.dataloader("test")

    def __str__(self) -> str:
        c = self.corpus_config
        where = {"hub": c.hub_id, "files": c.dir, "generated": "numbers"}[c.source]
        return f"TranslationDataModule({c.source}:{where}, {c.src_lang}->{c.tgt_lang})"
