"""Rows of token ids -> padded tensors, and the one rule for cutting over-long sentences.

Batches are dicts::

    src       LongTensor (B, S)  source ids + <eos>, padded with pad_id
    tgt       LongTensor (B, T)  <bos> + target ids + <eos>, padded with pad_id
                                 (the module uses tgt[:, :-1] -> tgt[:, 1:]); only when the
                                 rows have targets
    index     LongTensor (B,)    row of each example in its split (or input line), so
                                 length-sorted output can be put back in order
    src_text  list[str]          raw source sentences (when the rows have text)
    tgt_text  list[str]          raw reference sentences (for BLEU)

Every path builds its batches with :class:`Collate`, so they pad and cut alike.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import datasets
import torch
from torch.utils.data import Dataset


def source_limit(max_len: int | None, model_max_len: int | None = None) -> int | None:
    """The most subword ids (no specials) a sentence keeps, the one truncation rule:
    ``data.max_len`` and the model's ``max_len`` less one special; ``None``: no limit."""
    limits = []
    if max_len is not None:
        limits.append(int(max_len))
    if model_max_len is not None:
        limits.append(int(model_max_len) - 1)
    return min(limits) if limits else None


class TokenizedSplit(Dataset):
    """A tokenized split as a map-style dataset that fetches whole batches (one Arrow read
    per ``__getitems__``, not ``B`` row look-ups)."""

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
        max_len: Cut longer id sequences to this many tokens (:func:`source_limit`).
            ``None``: no cut.
    """

    def __init__(self, pad_id: int, bos_id: int, eos_id: int, max_len: int | None) -> None:
        self.pad_id, self.bos_id, self.eos_id, self.max_len = pad_id, bos_id, eos_id, max_len

    def _pad(self, rows: Sequence[Sequence[int]], prefix: list[int]) -> torch.Tensor:
        rows = [prefix + list(ids[: self.max_len]) + [self.eos_id] for ids in rows]
        out = torch.full((len(rows), max(map(len, rows))), self.pad_id, dtype=torch.long)
        for i, ids in enumerate(rows):
            out[i, : len(ids)] = torch.as_tensor(ids, dtype=torch.long)
        return out

    def __call__(self, columns: Any) -> dict[str, Any]:
        """``columns``: a dict of lists (``src_ids``, ``index``; ``tgt_ids``, ``src``,
        ``tgt`` when there are targets), as ``TokenizedSplit.__getitems__`` returns."""
        batch: dict[str, Any] = {
            "src": self._pad(columns["src_ids"], []),  # (B, S)
            "index": torch.as_tensor(columns["index"], dtype=torch.long),  # (B,)
        }
        if "tgt_ids" in columns:
            batch["tgt"] = self._pad(columns["tgt_ids"], [self.bos_id])  # (B, T)
        # Steering of decoding (forced prefixes, constraint phrases) stays as lists of ids.
        for key, column in (
            ("src_text", "src"), ("tgt_text", "tgt"),
            ("prefix_ids", "prefix_ids"), ("constraint_ids", "constraint_ids"),
        ):  # fmt: skip
            if column in columns:
                batch[key] = list(columns[column])
        return batch
