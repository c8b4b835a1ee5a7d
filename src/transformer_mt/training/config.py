"""The typed settings of a training run and the schema Hydra checks ``train.yaml`` against.

:class:`TrainingConfig` is the ``module`` section, which the Lightning module takes whole.
:class:`TrainSchema` types every key of ``train.yaml``, so a wrong type or an unknown key fails
at composition; the dataclasses hold the defaults, the YAML files are presets over them.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from omegaconf import MISSING, DictConfig, OmegaConf

from transformer_mt.data.config import DataConfig
from transformer_mt.errors import UserError
from transformer_mt.inference.search import SearchConfig
from transformer_mt.inference.settings import refuse_unknown_keys
from transformer_mt.model.config import ModelConfig
from transformer_mt.training.loss import WORD_DROPOUT_MODES
from transformer_mt.training.schedules import SCHEDULES

NONFINITE_LOSS = ("stop", "skip")


@dataclass
class TrainingConfig:
    """The learning-rate schedule, the loss and the scoring of one training run.

    Attributes:
        warmup_steps: linear warmup length in optimizer steps; the optimizer's ``lr`` is the
            peak reached at its end.
        lr_schedule: what follows the warmup: ``inverse_sqrt`` (the paper), or
            ``linear``/``cosine`` decay to zero at the end of the trainer's budget
            (``max_time``, ``max_steps`` or ``max_epochs``, whichever ends first).
        label_smoothing: epsilon of label smoothing (the paper's 0.1).
        word_dropout: probability of dropping each decoder input token in training; 0 = off.
        word_dropout_mode: ``unk`` (a dropped token becomes ``<unk>``) or ``zero`` (its
            embedding becomes the zero vector).
        num_examples: example translations logged at each validation.
        nonfinite_loss: ``stop`` raises :class:`~transformer_mt.errors.NonFiniteLossError`;
            ``skip`` skips the batch (no optimizer step) and counts it.
        decoding: the search of validation and test BLEU, stored in every checkpoint as the
            default of evaluate.py and translate.
    """

    warmup_steps: int = 400
    lr_schedule: str = "inverse_sqrt"
    label_smoothing: float = 0.1
    word_dropout: float = 0.0
    word_dropout_mode: str = "unk"
    num_examples: int = 3
    nonfinite_loss: str = "stop"
    decoding: SearchConfig = field(default_factory=SearchConfig)

    def __post_init__(self) -> None:
        if isinstance(self.decoding, Mapping):
            self.decoding = SearchConfig(**self.decoding)
        if self.warmup_steps < 0:
            raise ValueError(f"module.warmup_steps must be >= 0, got {self.warmup_steps}")
        if not 0.0 <= self.label_smoothing < 1.0:
            raise ValueError(
                f"module.label_smoothing must be in [0, 1), got {self.label_smoothing}"
            )
        if not 0.0 <= self.word_dropout < 1.0:
            raise ValueError(f"module.word_dropout must be in [0, 1), got {self.word_dropout}")
        if self.word_dropout_mode not in WORD_DROPOUT_MODES:
            raise ValueError(
                f"module.word_dropout_mode must be one of {', '.join(WORD_DROPOUT_MODES)}, "
                f"got {self.word_dropout_mode!r}"
            )
        if self.lr_schedule not in SCHEDULES:
            raise ValueError(
                f"module.lr_schedule must be one of {', '.join(SCHEDULES)}, "
                f"got {self.lr_schedule!r}"
            )
        if self.nonfinite_loss not in NONFINITE_LOSS:
            raise ValueError(
                f"module.nonfinite_loss must be 'stop' or 'skip', got {self.nonfinite_loss!r}"
            )


def model_settings(model: Any) -> dict[str, Any]:
    """The ``model`` group's values (a :data:`ModelGroup`, or its composed node), less the
    preset's ``name``: :class:`ModelConfig` keyword arguments but the tokenizer's sizes."""
    if isinstance(model, DictConfig):
        values = OmegaConf.to_container(model, resolve=True)
    else:
        values = dataclasses.asdict(model)
    assert isinstance(values, dict)
    values.pop("name", None)
    return values


#: ModelConfig fields that the tokenizer decides: not settings of the ``model`` group.
FROM_TOKENIZER = ("src_vocab_size", "tgt_vocab_size", "pad_id")


def _model_group_schema() -> type:
    """The ``model`` group: every :class:`ModelConfig` field (type and default) but those the
    tokenizer decides, plus the preset's ``name``. Derived, so that no field is written twice."""
    hints = typing.get_type_hints(ModelConfig)
    specs: list[tuple[str, Any, Any]] = [("name", str, field(default="custom"))]
    for f in fields(ModelConfig):
        if f.name not in FROM_TOKENIZER:
            specs.append((f.name, hints[f.name], field(default=f.default)))
    return dataclasses.make_dataclass("ModelGroup", specs)


ModelGroup = _model_group_schema()


@dataclass
class DataGroup(DataConfig):
    """The ``data`` group: :class:`DataConfig`'s fields and the target Hydra instantiates."""

    _target_: str = "transformer_mt.data.config.DataConfig"

    def config(self) -> DataConfig:
        """The :class:`DataConfig` these settings hold (without the target)."""
        return DataConfig(**{f.name: getattr(self, f.name) for f in fields(DataConfig)})


@dataclass
class BudgetSettings:
    """The options of the run's :class:`~transformer_mt.training.budget.TrainingBudget`
    (``budget.*``), documented there."""

    reserve_validation: bool = True
    max_warmup_fraction: float = 0.1
    initial_reserve: float = 0.05
    validations: int = 0


@dataclass
class DistillSettings:
    """``distill.*``: train on a teacher's translations of the training sources instead of
    their references (sequence-level knowledge distillation, docs/distillation.md); off while
    ``teacher`` is empty. Validation and test keep the human references.

    Attributes:
        teacher: the teacher's checkpoints (several: an ensemble).
        beam_size: the teacher's beam; its stored length penalty and normalisation hold.
        engine: ``torch`` or ``ctranslate2`` (one checkpoint, converted on the fly).
        compute_type: the engine's (``int8`` for CTranslate2; ``None``: its default).
        max_tokens: padded source tokens per teacher batch (``None``: the teacher's own).
        mix_references: train on the references too: each source with both targets.
        dir: where teachers' translations are kept, one folder per teacher, settings and data.
        shard_size: sources per shard; an interrupted decode resumes at the first missing one.
    """

    teacher: list[str] = field(default_factory=list)
    beam_size: int = 5
    engine: str = "torch"
    compute_type: str | None = None
    max_tokens: int | None = None
    mix_references: bool = False
    dir: str = ".cache/distilled"
    shard_size: int = 2000


@dataclass
class TrainSchema:
    """Every key of ``configs/train.yaml`` with its type and its one default; ``trainer``,
    ``callbacks``, ``logger`` and ``optimizer`` are ``_target_`` nodes their classes check.

    Attributes:
        task_name: names the output directory ``outputs/<task_name>/runs/<time>/``.
        seed: seeds everything, the generated corpus included.
        run_dir: where checkpoints, logs and the tokenizer go (Hydra's output directory).
        ckpt_path: resume from this checkpoint (``<run dir>/checkpoints/last.ckpt``).
        init_from: fine-tune: start from this checkpoint's weights and tokenizer, with a fresh
            optimizer, schedule and step count (training/finetune.py); its model settings stay.
        freeze: parts that keep their starting weights: ``embeddings``, ``encoder``,
            ``decoder``, ``generator`` or a submodule path such as ``encoder.layers.0``.
        optimized_metric: what train.py returns (and sweeps maximise): that metric of the
            last validation.
        test_after_fit: evaluate the best checkpoint on the test split after training.
        average_last: after training, average the last N saved checkpoints into
            ``checkpoints/average-lastN.ckpt``, which is then validated, tested and named as
            the run's result (training/average.py); 0 = off.
        threads: torch intra-op threads (``None``: one per core); on a shared CPU one per
            job avoids oversubscription.
    """

    task_name: str = MISSING
    seed: int = 42
    run_dir: str = MISSING
    ckpt_path: str | None = None
    init_from: str | None = None
    freeze: list[str] = field(default_factory=list)
    optimized_metric: str | None = "val/bleu"
    test_after_fit: bool = True
    average_last: int = 0
    threads: int | None = None
    data: DataGroup = field(default_factory=DataGroup)
    model: Any = field(default_factory=ModelGroup)  # typed by its ModelGroup default
    module: TrainingConfig = field(default_factory=TrainingConfig)
    optimizer: dict[str, Any] = field(default_factory=dict)
    budget: BudgetSettings = field(default_factory=BudgetSettings)
    distill: DistillSettings = field(default_factory=DistillSettings)
    trainer: dict[str, Any] = field(default_factory=dict)
    callbacks: dict[str, Any] = field(default_factory=dict)
    logger: dict[str, Any] = field(default_factory=dict)


def train_settings(cfg: DictConfig | TrainSchema) -> TrainSchema:
    """The composed config as typed objects (interpolations resolved); typed settings as
    they are.

    Raises:
        UserError: a required value (``???``) was not given; the message names the keys.
    """
    if isinstance(cfg, TrainSchema):
        return cfg
    missing = sorted(OmegaConf.missing_keys(cfg))
    if missing:
        example = " ".join(f"{key}=..." for key in missing)
        raise UserError(
            f"missing required config value(s): {', '.join(missing)}; set them on the command "
            f"line, e.g. python train.py ... {example}"
        )
    refuse_unknown_keys(cfg)
    settings = OmegaConf.to_object(cfg)
    assert isinstance(settings, TrainSchema), type(settings)
    return settings


def register_schemas() -> None:
    """Register :class:`TrainSchema` as ``train_schema``, the first entry of train.yaml's
    defaults list (idempotent)."""
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name="train_schema", node=TrainSchema)
