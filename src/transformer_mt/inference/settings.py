"""The typed settings of an evaluation and the schema Hydra checks ``evaluate.yaml`` against.

:class:`EvalSchema` types every key of ``configs/evaluate.yaml``; ``register_eval_schema`` puts
it into Hydra's ConfigStore as the first entry of that file's defaults, so a value of the wrong
type or an unknown key fails when the config is composed. :func:`eval_settings` turns the
composed config into the dataclasses once, first refusing a key that Hydra's ``+key=value``
forced in (``+data.vocab_sise=100``), before any checkpoint is read; the pipeline
(:mod:`transformer_mt.inference.evaluate`) reads their attributes.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from typing import Any, Optional

from omegaconf import MISSING, DictConfig, OmegaConf

from transformer_mt.checkpoint import CheckpointError
from transformer_mt.data.config import DataConfig
from transformer_mt.inference.search import SearchConfig

NO_CHECKPOINT = (
    "no checkpoint given; run `python evaluate.py ckpt_path=PATH`, e.g. "
    "ckpt_path=outputs/<task>/runs/<time>/checkpoints/last.ckpt (an ensemble: "
    "ckpt_path=[A.ckpt,B.ckpt])"
)


@dataclass
class BatchSettings:
    """``batch.*``: padded source tokens or sentences per batch (``None``: the data's
    ``eval_max_tokens``)."""

    max_tokens: int | None = None
    sentences: int | None = None


def _overrides_schema(
    name: str, of: type, *, leave_out: tuple[str, ...] = (), first: tuple[str, ...] = ()
) -> type:
    """Every field of the dataclass ``of`` (but ``leave_out``), optional with ``None`` = "as
    the checkpoint stores it", after the optional strings ``first``. Derived, so that no field
    is written twice."""
    hints = typing.get_type_hints(of)
    specs: list[tuple[str, Any, Any]] = [
        (key, Optional[str], field(default=None))  # noqa: UP045
        for key in first
    ]
    for f in dataclasses.fields(of):
        if f.name in leave_out:
            continue
        hint = hints[f.name]
        if typing.get_origin(hint) is dict:  # data.prefixes.test=... keeps the other entries
            key, value = typing.get_args(hint)
            hint = dict[key, Optional[value]]  # type: ignore[valid-type]  # noqa: UP045
        specs.append((f.name, Optional[hint], field(default=None)))  # noqa: UP045
    return dataclasses.make_dataclass(name, specs)


#: ``decoding.*``: ``None`` keeps what the checkpoint (or ``decoding_from``) says. How a
#: search runs (``use_cache``) is not an evaluation setting.
DecodingOverrides = _overrides_schema("DecodingOverrides", SearchConfig, leave_out=("use_cache",))

#: ``data.*``: every data setting, plus the ``_target_`` a data group (``data=numbers``) names.
DataOverrides = _overrides_schema("DataOverrides", DataConfig, first=("_target_",))


@dataclass
class EvalSchema:
    """Every key of ``configs/evaluate.yaml`` and its type; the YAML holds the presets.

    Attributes (the YAML file says what each does):
        ckpt_path: one path, or a list of paths: an ensemble.
    """

    ckpt_path: Any = MISSING
    split: str = "test"
    source_file: str | None = None
    reference_file: str | None = None
    tgt_lang: str | None = None
    errors: str = "strict"
    decoding_from: str | None = None
    decoding: DecodingOverrides = field(default_factory=DecodingOverrides)
    prefix_file: str | None = None
    constraints_file: str | None = None
    alignments: bool = False
    batch: BatchSettings = field(default_factory=BatchSettings)
    device: str = "auto"
    engine: str = "torch"
    engine_model: str | None = None
    compute_type: str = "default"
    threads: int | None = None
    progress: bool = True
    run_dir: str = MISSING
    seed: int = 42
    results_path: str | None = None
    hypotheses_path: str | None = None
    optimized_metric: str = "metrics.bleu"
    data: Any = field(default_factory=DataOverrides)  # typed by its DataOverrides default


def register_eval_schema() -> None:
    """Register :class:`EvalSchema` as ``eval_schema``, the first entry of evaluate.yaml's
    defaults list (idempotent)."""
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name="eval_schema", node=EvalSchema)


def eval_settings(cfg: DictConfig | EvalSchema) -> EvalSchema:
    """The composed config as typed objects (interpolations resolved); typed ones as they are."""
    if isinstance(cfg, EvalSchema):
        return cfg
    refuse_unknown_keys(cfg)
    if OmegaConf.is_missing(cfg, "ckpt_path"):
        raise CheckpointError(NO_CHECKPOINT)
    settings = OmegaConf.to_object(cfg)
    assert isinstance(settings, EvalSchema), type(settings)
    return settings


def data_overrides(data: Any) -> dict[str, Any]:
    """The ``data.*`` values that are set (``None`` leaves dropped, recursively), from the
    typed ``data`` settings or the composed ``data`` node."""
    if isinstance(data, DictConfig):
        data = OmegaConf.to_container(data, resolve=True)
    values = dataclasses.asdict(data) if dataclasses.is_dataclass(data) else dict(data)
    return _non_null(values)


def _non_null(values: Any) -> Any:
    if isinstance(values, dict):
        out = {k: _non_null(v) for k, v in values.items() if v is not None}
        return {k: v for k, v in out.items() if v != {}}
    return values


def refuse_unknown_keys(node: Any, where: str = "") -> None:
    """Refuse a key that no schema field names, at any depth (``+data.vocab_sise=100``).

    Hydra's ``+key=value`` adds a key even to a typed node, and ``OmegaConf.to_object`` keeps
    it as a stray attribute, so the typed settings would silently ignore a misspelt setting.

    Raises:
        ValueError: naming the key and the keys its node has.
    """
    schema = OmegaConf.get_type(node)
    if not (isinstance(schema, type) and dataclasses.is_dataclass(schema)):
        return  # a plain mapping (data.prefixes, ...): any key is a value
    known = [f.name for f in dataclasses.fields(schema)]
    for key in node:
        path = f"{where}{key}"
        if key not in known:
            place = f"of {where[:-1]}" if where else "at the top"
            raise ValueError(
                f"unknown setting {path!r}; the settings {place} "
                f"are {', '.join(k for k in known if not k.startswith('_'))} (fix its spelling, "
                "or drop the override)"
            )
        child = node._get_node(key)
        if isinstance(child, DictConfig) and not child._is_missing() and not child._is_none():
            refuse_unknown_keys(child, f"{path}.")
