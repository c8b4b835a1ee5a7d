"""``TranslationDataModule``: the Lightning face of :mod:`transformer_mt.data.prepare`.

Training batches by token budget, shuffled per epoch and resumable mid-epoch; validation and
test batches from :func:`~transformer_mt.data.prepare.decode_loader`, as evaluate.py's, so
both score BLEU over the same batches (batch format: :mod:`transformer_mt.data.collate`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import datasets
import lightning.pytorch as pl
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from transformer_mt.data.batching import TokenBudgetBatchSampler
from transformer_mt.data.bpe_dropout import EpochSegmentation
from transformer_mt.data.collate import Collate, TokenizedSplit, source_limit
from transformer_mt.data.config import DataConfig
from transformer_mt.data.directions import sample_epoch
from transformer_mt.data.prepare import PreparedData, decode_loader, prepare
from transformer_mt.data.tokenizer import Tokenizer


def _batches_done(trainer: Any) -> int:
    """Training batches finished in the current epoch (as counted by Lightning's loop)."""
    return int(trainer.fit_loop.epoch_loop.batch_progress.current.processed)


class ResumableDataLoader(DataLoader):
    """A DataLoader whose position in the epoch is saved in checkpoints, so a mid-epoch
    resume skips the batches already trained on and keeps the uninterrupted data order."""

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


class SegmentedSplit(Dataset):
    """The training split with one epoch's BPE-dropout ids in place of the stored ones."""

    def __init__(
        self, index: Sequence[int], src_ids: list[list[int]], tgt_ids: list[list[int]]
    ) -> None:
        self.index, self.src_ids, self.tgt_ids = list(index), src_ids, tgt_ids

    def __len__(self) -> int:
        return len(self.index)

    def __getitems__(self, indices: Sequence[int]) -> dict[str, list[Any]]:
        return {
            "src_ids": [self.src_ids[i] for i in indices],
            "tgt_ids": [self.tgt_ids[i] for i in indices],
            "index": [self.index[i] for i in indices],
        }

    def __getitem__(self, index: int) -> dict[str, list[Any]]:
        return self.__getitems__([index])


class TranslationDataModule(pl.LightningDataModule):
    """Parallel text for training, validation and test, batched by token budget.

    After :meth:`setup` it exposes ``tokenizer``, ``src_vocab_size``, ``tgt_vocab_size``,
    ``pad_id`` and the tokenized ``splits``.

    Args:
        work_dir: Run directory; ``tokenizer.json`` is written to (and reused from) here.
            ``None``: the tokenizer is not saved.
        tokenizer: A ready tokenizer (e.g. from a checkpoint) instead of training one.
        only_splits: Tokenize just these splits (with a ready ``tokenizer``). ``None``: all.
        model_max_len: The model's positional ``max_len``: validation and test sources are
            cut to :func:`~transformer_mt.data.collate.source_limit` of it and
            ``config.max_len``, as evaluate.py and translate cut them.
    """

    def __init__(
        self,
        config: DataConfig,
        work_dir: str | Path | None = None,
        tokenizer: Tokenizer | None = None,
        only_splits: list[str] | None = None,
        model_max_len: int | None = None,
    ) -> None:
        super().__init__()
        if not isinstance(config, DataConfig):
            raise TypeError(f"config must be a DataConfig, got {type(config).__name__}")
        if only_splits is not None and tokenizer is None:
            raise ValueError("only_splits needs a ready tokenizer (training one needs 'train').")
        self.config = config
        self.work_dir = None if work_dir is None else Path(work_dir)
        self.tokenizer: Tokenizer | None = tokenizer
        self.only_splits = only_splits
        self.model_max_len = model_max_len
        self.data: PreparedData | None = None
        self._segmentation: EpochSegmentation | None = None
        self._drawn: tuple[int, np.ndarray | None] | None = None  # (epoch, its examples)

    # -------------------------------------------------------------- properties

    @property
    def name(self) -> str:
        return str(self.config.name)

    @property
    def src_lang(self) -> str:
        return self.config.src_lang

    @property
    def tgt_lang(self) -> str:
        return self.config.tgt_lang

    def _require_setup(self) -> PreparedData:
        if self.data is None:
            raise RuntimeError("Call datamodule.setup() before using its tokenizer or loaders.")
        return self.data

    @property
    def splits(self) -> dict[str, datasets.Dataset]:
        return {} if self.data is None else self.data.splits

    @property
    def available_splits(self) -> list[str]:
        """Every split the corpus has (``splits`` holds the tokenized ones)."""
        return [] if self.data is None else self.data.available_splits

    @property
    def src_vocab_size(self) -> int:
        return self._require_setup().tokenizer.src_vocab_size

    @property
    def tgt_vocab_size(self) -> int:
        return self._require_setup().tokenizer.tgt_vocab_size

    @property
    def pad_id(self) -> int:
        return self._require_setup().tokenizer.pad_id

    # ------------------------------------------------------------ preparation

    def prepare_data(self) -> None:
        """Download, train the tokenizer and tokenize (once per node, before setup)."""
        self._prepare()

    def setup(self, stage: str | None = None) -> None:
        """Build every split (a no-op when already built in this process)."""
        self._prepare()

    def _prepare(self) -> None:
        if self.data is not None:
            return
        self.data = prepare(self.config, self.tokenizer, self.work_dir, self.only_splits)
        self.tokenizer = self.data.tokenizer

    # ------------------------------------------------------------- dataloaders

    def _rank_and_world(self) -> tuple[int, int]:
        trainer = self._trainer_or_none()
        if trainer is None:
            return 0, 1
        return int(trainer.global_rank), int(trainer.world_size)

    def _trainer_or_none(self) -> Any:
        try:
            return self.trainer
        except RuntimeError:
            return None

    def segmentation(self) -> EpochSegmentation | None:
        """The training set's per-epoch BPE-dropout ids (``None`` when ``bpe_dropout`` is 0)."""
        if self.config.bpe_dropout <= 0:
            return None
        if self._segmentation is None:
            data = self._require_setup()
            train = data.splits["train"]
            self._segmentation = EpochSegmentation(
                data.tokenizer.src,
                data.tokenizer.tgt,
                train["src"],
                train["tgt"],
                p=self.config.bpe_dropout,
                seed=self.config.seed,
            )
        return self._segmentation

    def epoch_examples(self, epoch: int) -> np.ndarray | None:
        """The training examples of ``epoch`` when the directions are resampled each epoch
        (``data.direction_temperature`` other than 1; indices, with repeats), else ``None``:
        every training pair once."""
        if not self.config.resamples_directions:
            return None
        if self._drawn is None or self._drawn[0] != epoch:  # the loader and its sampler ask
            directions = self._require_setup().splits["train"]["direction"]
            groups = np.unique(np.asarray(directions), return_inverse=True)[1]
            temperature, seed = self.config.direction_temperature, self.config.seed + epoch
            self._drawn = epoch, sample_epoch(groups, temperature, seed)
        return self._drawn[1]

    def _per_epoch(self) -> bool:
        """Whether the training data changes with the epoch (BPE-dropout, or a draw of the
        directions): only then is the trainer asked for its epoch."""
        return self.config.bpe_dropout > 0 or self.config.resamples_directions

    def _epoch(self) -> int:
        trainer = self._trainer_or_none()
        return 0 if trainer is None else int(trainer.current_epoch)

    def batch_sampler(
        self, split_name: str = "train", epoch: int | None = None
    ) -> TokenBudgetBatchSampler:
        """The shuffled token-budget sampler of a training split: ``B * max(S, T)``.

        Lengths are those of ``epoch``'s BPE-dropout segmentation (default: the trainer's
        epoch), and positions those of :meth:`epoch_examples` when directions are resampled.
        """
        data = self._require_setup()
        if split_name not in data.splits:
            raise ValueError(f"No split {split_name!r}; available: {sorted(data.splits)}.")
        src_len, tgt_len = data.lengths[split_name]
        per_epoch = split_name == "train" and self._per_epoch()
        if per_epoch and epoch is None:
            epoch = self._epoch()
        segmentation = self.segmentation() if split_name == "train" else None
        if segmentation is not None:
            src_len, tgt_len = segmentation.lengths(epoch)
        examples = self.epoch_examples(epoch) if per_epoch else None
        if examples is not None:
            src_len, tgt_len = np.asarray(src_len)[examples], np.asarray(tgt_len)[examples]
        rank, world = self._rank_and_world()
        limit = self.config.max_len
        return TokenBudgetBatchSampler(
            np.minimum(src_len, limit) + 1,  # + <eos>
            np.minimum(tgt_len, limit) + 2,  # <bos> + ... + <eos>
            max_tokens=self.config.max_tokens,
            shuffle=True,
            seed=self.config.seed,
            rank=rank,
            world_size=world,
        )

    def train_dataloader(self) -> DataLoader:
        """This epoch's training batches (reloaded every epoch under BPE-dropout or a draw of
        the directions)."""
        data = self._require_setup()
        tok = data.tokenizer
        trainer = self._trainer_or_none()
        segmentation = self.segmentation()
        per_epoch = self._per_epoch()
        epoch = self._epoch() if per_epoch else 0
        examples = self.epoch_examples(epoch)
        dataset: Dataset
        if segmentation is None:
            train = data.splits["train"]
            dataset = TokenizedSplit(train if examples is None else train.select(examples))
        else:
            src_ids, tgt_ids = segmentation.ids(epoch)
            index = data.splits["train"]["index"]
            if examples is not None:
                picked = examples.tolist()
                index = [index[i] for i in picked]
                src_ids, tgt_ids = [src_ids[i] for i in picked], [tgt_ids[i] for i in picked]
            dataset = SegmentedSplit(index, src_ids, tgt_ids)
        sampler = self.batch_sampler("train", epoch if per_epoch else None)
        if per_epoch:
            sampler.set_epoch(epoch)
        return ResumableDataLoader(
            dataset,
            batch_sampler=sampler,
            collate_fn=Collate(tok.pad_id, tok.bos_id, tok.eos_id, self.config.max_len),
            num_workers=self.config.num_workers,
            persistent_workers=self.config.num_workers > 0,
            # Its own generator: the global RNG (dropout's) stays as a resume replays it.
            generator=torch.Generator().manual_seed(self.config.seed),
            progress=(lambda: _batches_done(trainer)) if trainer is not None else None,
        )

    def dataloader(self, split_name: str) -> DataLoader:
        """Decoding batches of any split, sorted by source length (``batch["index"]`` gives
        the corpus order back); this rank's share under DDP."""
        rank, world = self._rank_and_world()
        limit = source_limit(self.config.max_len, self.model_max_len)
        return decode_loader(self._require_setup(), split_name, limit, rank=rank, world_size=world)

    def val_dataloader(self) -> DataLoader:
        return self.dataloader("validation")

    def test_dataloader(self) -> DataLoader:
        return self.dataloader("test")

    def __str__(self) -> str:
        c = self.config
        where = {"hub": c.hub_id, "files": c.dir, "generated": "numbers"}[c.source]
        return f"TranslationDataModule({c.source}:{where}, {c.src_lang}->{c.tgt_lang})"
