"""Data pipeline: corpora, byte-level BPE, token-budget batching, the DataModule.

Import the DataModule from :mod:`transformer_mt.data.datamodule` (it pulls
in Lightning); the other modules need only ``datasets``/``tokenizers``/numpy.
"""

from transformer_mt.data.batching import TokenBudgetBatchSampler, padding_efficiency
from transformer_mt.data.corpus import CorpusConfig, load_corpus
from transformer_mt.data.tokenizer import Tokenizer

__all__ = [
    "CorpusConfig",
    "TokenBudgetBatchSampler",
    "Tokenizer",
    "load_corpus",
    "padding_efficiency",
]
