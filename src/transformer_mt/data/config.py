"""``DataConfig``: every data setting, typed, with its one default.

``configs/data/*.yaml`` instantiate it; every checkpoint stores it and evaluate.py rebuilds it
(:meth:`DataConfig.from_dict`). The defaults are ``configs/data/numbers.yaml``'s (a test holds
them equal), except ``cache_dir``: without one nothing is written outside the run directory.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from transformer_mt.data.directions import parse_directions, summary_languages

SOURCES = ("hub", "files", "generated")
FILE_FORMATS = ("auto", "parallel", "tsv", "jsonl")
TASKS = ("sentences", "numbers")

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

#: Keys a stored data config may carry beside the settings: the Hydra target, the data
#: module's other arguments, and data.dir as typed (``dir`` itself is stored absolute).
_NOT_SETTINGS = ("_target_", "_convert_", "work_dir", "tokenizer", "only_splits", "dir_as_typed")


@dataclass
class DataConfig:
    """Where the parallel text comes from, how it is tokenized and batched.

    Attributes:
        name: A label for run names and logs (``multi30k_en_de``); default
            ``{source}_{src_lang}_{tgt_lang}``.
        source: ``"generated"`` (the embedded number sentences), ``"files"`` or ``"hub"``.
        src_lang, tgt_lang: Language codes; they name columns and files.
        hub_id: Hub data set id (``bentrevett/multi30k``, ``wmt/wmt14``), ``source=hub``.
        hub_config: Hub config name (``de-en``); ``None`` if it has none.
        hub_splits: Our split name -> the Hub's split name.
        hub_revision: Hub revision; ``refs/convert/parquet`` reads the Parquet export of a
            script-based data set.
        dir: Directory of local files, ``source=files`` (relative to the current directory).
        prefixes: Split name -> file prefix in ``dir``; an extra entry adds a split.
        file_format: ``"parallel"`` ({prefix}.{lang}), ``"tsv"``, ``"jsonl"`` or ``"auto"``.
        sizes: Generated split sizes.
        number_range: Generated numbers are drawn from ``[low, high]`` (inclusive).
        task: Generated task: ``"sentences"`` (templates) or ``"numbers"`` (bare number words).
        directions: Several directions for one model (``["de-en", "fr-en"]``): each source
            gets its target language's tag, ``src_lang``/``tgt_lang`` become the shared
            languages (or ``mul``). Empty: the one direction ``src_lang -> tgt_lang``.
        direction_temperature: How an epoch mixes several directions: 1 = in proportion to
            their sizes, larger = flatter (5 is usual).
        vocab_size: BPE vocabulary size (each side if not joint).
        joint_vocab: One vocabulary for both languages (lets the model tie embeddings).
        min_frequency: Minimum count of a BPE merge.
        bpe_dropout: BPE-dropout probability of the training sentences, resampled every
            epoch (docs/data.md); ``0``: off.
        max_tokens: Training batch budget, padding included: ``B * max(S, T)``.
        eval_max_tokens: Decoding batch budget, padded *source* tokens ``B * max(S)``;
            ``None``: ``max_tokens``.
        max_len: Longest sentence in subword tokens, without ``<bos>``/``<eos>``. Longer
            training pairs are dropped; longer eval sources are cut.
        num_workers: DataLoader worker processes.
        num_proc: Processes for tokenizing with ``datasets.map``.
        seed: Seed of the generated corpus and of batch shuffling.
        cache_dir: Where tokenized Arrow files and the generated corpus are kept (``None``:
            in memory). Hub downloads use the ``datasets`` cache (``HF_DATASETS_CACHE``).
        train_targets: A UTF-8 file with one target line per training pair, in order, trained
            on instead of the corpus's targets (a teacher's translations: distillation,
            ``distill.teacher``); validation and test keep theirs.
        train_targets_mix: Train on both: the corpus's pairs and the same sources with
            ``train_targets``.
    """

    name: str | None = None
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
    number_range: tuple[int, int] = (2, 99999)
    task: str = "sentences"
    directions: list[str] = field(default_factory=list)
    direction_temperature: float = 1.0
    vocab_size: int = 512
    joint_vocab: bool = True
    min_frequency: int = 2
    bpe_dropout: float = 0.0
    max_tokens: int = 2048
    eval_max_tokens: int | None = 4096
    max_len: int = 64
    num_workers: int = 0
    num_proc: int = 1
    seed: int = 0
    cache_dir: str | None = None
    train_targets: str | None = None
    train_targets_mix: bool = False

    def __post_init__(self) -> None:
        # Plain types, as a checkpoint may hold them (torch.load(weights_only=True)).
        self.hub_splits = {str(k): str(v) for k, v in dict(self.hub_splits).items()}
        self.prefixes = {str(k): str(v) for k, v in dict(self.prefixes).items()}
        self.sizes = {str(k): int(v) for k, v in dict(self.sizes).items()}
        self.directions = [str(d).strip() for d in list(self.directions or [])]
        if self.directions:
            self.src_lang, self.tgt_lang = summary_languages(parse_directions(self.directions))
        if len(self.number_range) != 2:
            raise ValueError(
                f"data.number_range must be [low, high], got {list(self.number_range)}; "
                "e.g. data.number_range=[2,99999]"
            )
        self.number_range = (int(self.number_range[0]), int(self.number_range[1]))
        self.dir = None if self.dir is None else str(self.dir)
        self.cache_dir = None if self.cache_dir is None else str(self.cache_dir)
        self.train_targets = None if self.train_targets is None else str(self.train_targets)
        self.train_targets_mix = bool(self.train_targets_mix)
        for key in ("vocab_size", "min_frequency", "max_tokens", "max_len", "seed"):
            setattr(self, key, int(getattr(self, key)))
        self.num_workers, self.num_proc = int(self.num_workers), int(self.num_proc)
        self.joint_vocab = bool(self.joint_vocab)
        self.bpe_dropout = float(self.bpe_dropout)
        self.direction_temperature = float(self.direction_temperature)
        if self.eval_max_tokens is None:
            self.eval_max_tokens = self.max_tokens
        self.eval_max_tokens = int(self.eval_max_tokens)
        if self.name is None:
            self.name = f"{self.source}_{self.src_lang}_{self.tgt_lang}"
        self._check()

    def _check(self) -> None:
        if self.source not in SOURCES:
            raise ValueError(
                f"Unknown corpus source {self.source!r}; choose one of {SOURCES} "
                "(e.g. data.source=files)."
            )
        if self.file_format not in FILE_FORMATS:
            raise ValueError(
                f"Unknown file_format {self.file_format!r}; choose one of {FILE_FORMATS}."
            )
        if self.task not in TASKS:
            raise ValueError(
                f"Unknown generated task {self.task!r}; use data.task=sentences or numbers."
            )
        if self.src_lang == self.tgt_lang and not self.directions:
            raise ValueError(
                f"src_lang and tgt_lang are both {self.src_lang!r}; set two different "
                "languages, e.g. data.src_lang=en data.tgt_lang=de."
            )
        if self.max_len < 1:
            raise ValueError(f"max_len must be at least 1, got {self.max_len}.")
        if self.train_targets and self.directions:
            raise ValueError(
                "train_targets replaces one direction's training targets; distil each "
                "direction on its own, or drop data.directions."
            )
        if not 0.0 <= self.bpe_dropout < 1.0:
            raise ValueError(
                f"bpe_dropout must be in [0, 1), got {self.bpe_dropout}; "
                "e.g. data.bpe_dropout=0.1 (0 turns it off)."
            )
        if not (math.isfinite(self.direction_temperature) and self.direction_temperature > 0):
            raise ValueError(
                f"direction_temperature must be a positive number, got "
                f"{self.direction_temperature}; e.g. data.direction_temperature=5 (1: in "
                "proportion to the directions' sizes)."
            )
        for key in ("max_tokens", "eval_max_tokens"):
            value = getattr(self, key)
            if value < self.max_len + 2:  # the longest tensor row is <bos> + max_len + <eos>
                raise ValueError(
                    f"{key}={value} cannot hold one sentence of max_len={self.max_len} "
                    f"(+2 special tokens); raise data.{key} or lower data.max_len."
                )

    @property
    def pairs(self) -> list[tuple[str, str]]:
        """The ``(src, tgt)`` of every direction: several, or the one of the languages."""
        if self.directions:
            return parse_directions(self.directions)
        return [(self.src_lang, self.tgt_lang)]

    @property
    def multilingual(self) -> bool:
        return bool(self.directions)

    @property
    def resamples_directions(self) -> bool:
        """Whether each epoch draws its own mix of directions (a temperature other than 1)."""
        return self.multilingual and self.direction_temperature != 1.0

    def to_dict(self) -> dict[str, Any]:
        """Plain types only (lists, not tuples): for checkpoints and YAML."""
        values = asdict(self)
        values["number_range"] = list(self.number_range)
        return values

    def stored(self) -> dict[str, Any]:
        """:meth:`to_dict` for a checkpoint: ``dir`` absolute (evaluable from anywhere), as
        typed under ``dir_as_typed``."""
        values = self.to_dict()
        if self.dir:
            values["dir"] = os.path.abspath(self.dir)
            values["dir_as_typed"] = str(self.dir)
        return values

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> DataConfig:
        """A config from a stored mapping (a checkpoint's, a run's ``.hydra/config.yaml``'s,
        merged with overrides); an unknown key other than :data:`_NOT_SETTINGS` is an error."""
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in values.items() if k not in _NOT_SETTINGS}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(
                f"unknown data config key(s) {unknown}; the data settings are "
                f"{sorted(known)} (see transformer_mt/data/config.py)"
            )
        return cls(**values)


def stored_overrides() -> dict[str, Any]:
    """Every :class:`DataConfig` key set to ``None`` ("as stored"), dict keys one level deep:
    evaluate.py's ``data=stored``, so that overrides like ``data.prefixes.test=...`` exist."""
    node: dict[str, Any] = {}
    defaults = DataConfig()
    for f in fields(DataConfig):
        default = getattr(defaults, f.name)
        node[f.name] = {k: None for k in default} if isinstance(default, dict) else None
    return node


def register_stored_overrides() -> None:
    """Register :func:`stored_overrides` as the Hydra config ``data=stored`` (idempotent)."""
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(group="data", name="stored", node=stored_overrides())
