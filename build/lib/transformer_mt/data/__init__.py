"""Data pipeline: one ``DataConfig``, corpus sources, byte-level BPE, batching, collate.

Import the Lightning DataModule from :mod:`transformer_mt.data.datamodule`; everything else
(:mod:`.prepare` included, which evaluate.py uses) needs only ``datasets``/``tokenizers``/torch.
"""

from transformer_mt.data.batching import TokenBudgetBatchSampler, padding_efficiency
from transformer_mt.data.config import DataConfig
from transformer_mt.data.sources import load_corpus
from transformer_mt.data.tokenizer import Tokenizer

__all__ = [
    "DataConfig",
    "TokenBudgetBatchSampler",
    "Tokenizer",
    "load_corpus",
    "padding_efficiency",
]
