"""Fine-tuning from a trained model: ``python train.py init_from=CKPT data=... [freeze=[...]]``.

The run takes the checkpoint's weights, tokenizer (its ids are what the weights mean) and
model shape; optimizer, schedule and step count start afresh, and only :data:`FINETUNABLE`
settings come from the run's config (docs/finetuning.md). ``freeze`` keeps named parts at
their weights; parameters are frozen as objects, so a tied embedding is frozen everywhere.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import BaseFinetuning
from torch import nn

from transformer_mt.checkpoint import CheckpointError, LoadedModel, load_model
from transformer_mt.data.tokenizer import FILENAME, Tokenizer
from transformer_mt.errors import UserError
from transformer_mt.model.transformer import ModelConfig
from transformer_mt.training.config import TrainSchema, model_settings

log = logging.getLogger(__name__)

#: Model settings a fine-tuning run may change: not the weights' shapes or meaning.
FINETUNABLE = ("dropout", "attention_dropout", "fused_attention")
#: Data settings that decide the tokenizer; with ``init_from`` the checkpoint's tokenizer rules.
TOKENIZER_KEYS = ("vocab_size", "joint_vocab", "min_frequency")
#: Names ``freeze`` accepts besides submodule paths, and the submodules they stand for.
PARTS = {
    "embeddings": ("encoder.embedding", "decoder.embedding"),
    "encoder": ("encoder",),
    "decoder": ("decoder",),
    "generator": ("generator",),
}


@dataclass
class FineTuneStart:
    """What a fine-tuning run takes from ``init_from``: weights, tokenizer, model config."""

    init: LoadedModel
    tokenizer: Tokenizer
    model_config: ModelConfig

    def load_weights(self, model: nn.Module) -> None:
        """Copy the checkpoint's weights into the freshly built ``model`` (same shapes)."""
        model.load_state_dict(self.init.model.state_dict())
        log.info("init_from: weights of %s (step %s)", self.init.path, self.init.global_step)


def finetune_start(cfg: TrainSchema, run_dir: Path) -> FineTuneStart | None:
    """``cfg.init_from`` read and checked against the run's settings; ``None`` without it."""
    if not cfg.init_from:
        return None
    init = load_init(cfg.init_from)
    config = finetune_model_config(init, model_settings(cfg.model), explicit_overrides("model"))
    data = cfg.data.config().to_dict()
    check_languages(init, data)
    check_tokenizer_settings(init, data, explicit_overrides("data"))
    return FineTuneStart(init, adopt_tokenizer(init, run_dir), config)


def check_languages(init: LoadedModel, cfg_data: dict[str, Any]) -> None:
    """The run translates in the checkpoint's direction: its tokenizer and weights are for it.

    Raises:
        UserError: one line with both directions and the two fixes that work.
    """
    asked = (cfg_data.get("src_lang"), cfg_data.get("tgt_lang"))
    if asked != (init.src_lang, init.tgt_lang):
        raise UserError(
            f"init_from={init.path} translates {init.src_lang}->{init.tgt_lang}, the data "
            f"{asked[0]}->{asked[1]}; fine-tune on {init.src_lang}->{init.tgt_lang} data "
            f"(data.src_lang={init.src_lang} data.tgt_lang={init.tgt_lang}), or start from a "
            f"{asked[0]}->{asked[1]} checkpoint"
        )


def load_init(path: Any) -> LoadedModel:
    """The model to start from; a file that is not a transformer-mt checkpoint is one error line."""
    try:
        return load_model(Path(str(path)))
    except CheckpointError as err:
        raise CheckpointError(f"init_from: {err}") from None


def explicit_overrides(prefix: str) -> set[str]:
    """Keys under ``prefix`` (``"model"``) set on the command line; all of them (``"*"``) for
    ``model=X``; none outside ``@hydra.main``."""
    try:
        from hydra.core.hydra_config import HydraConfig

        overrides = list(HydraConfig.get().overrides.task)
    except ValueError:
        return set()
    keys: set[str] = set()
    for item in overrides:
        name = item.split("=", 1)[0].lstrip("+~")
        if name == prefix:
            keys.add("*")
        elif name.startswith(prefix + "."):
            keys.add(name[len(prefix) + 1 :])
    return keys


def finetune_model_config(
    init: LoadedModel, cfg_model: dict[str, Any], explicit: set[str]
) -> ModelConfig:
    """The checkpoint's model config with the :data:`FINETUNABLE` values of the run's config.

    Raises:
        UserError: a setting given on the command line (``explicit``; ``"*"`` = a ``model=``
            group) differs from the checkpoint's and cannot change in fine-tuning.
    """
    saved = init.config.to_dict()
    differ = [
        f"model.{key}={cfg_model[key]!r} (checkpoint: {saved[key]!r})"
        for key in saved
        if key in cfg_model and key not in FINETUNABLE and cfg_model[key] != saved[key]
        if "*" in explicit or key in explicit
    ]
    if differ:
        raise UserError(
            f"init_from={init.path} holds another model than asked for: {', '.join(differ)}; "
            "fine-tuning keeps the checkpoint's shape: drop these overrides (only "
            f"{', '.join('model.' + k for k in FINETUNABLE)} may change)"
        )
    changed = {k: cfg_model[k] for k in FINETUNABLE if k in cfg_model}
    return dataclasses.replace(init.config, **changed)


def check_tokenizer_settings(
    init: LoadedModel, cfg_data: dict[Any, Any], explicit: set[str]
) -> None:
    """Data settings given on the command line that ask for another tokenizer are an error."""
    wanted = init.tokenizer.config or {}
    asked = {
        "vocab_size": init.tokenizer.src_vocab_size,
        "joint_vocab": init.tokenizer.joint,
        **{"joint_vocab" if k == "joint" else k: v for k, v in wanted.items()},
    }
    differ = [
        f"data.{key}={cfg_data[key]!r} (checkpoint: {asked[key]!r})"
        for key in TOKENIZER_KEYS
        if key in explicit and key in asked and cfg_data.get(key) != asked[key]
    ]
    if differ:
        raise UserError(
            f"init_from={init.path} has another vocabulary than asked for: {', '.join(differ)}; "
            "a fine-tuning run keeps the checkpoint's tokenizer (its ids are what the weights "
            "mean): drop these overrides"
        )


def adopt_tokenizer(init: LoadedModel, run_dir: Path) -> Tokenizer:
    """The checkpoint's tokenizer, saved in ``run_dir`` like a trained one would be.

    Raises:
        UserError: ``run_dir`` already holds another tokenizer; it is not overwritten.
    """
    tokenizer, path = init.tokenizer, run_dir / FILENAME
    if path.is_file():
        existing = Tokenizer.load(path)
        if existing.to_json() != tokenizer.to_json():
            raise UserError(
                f"init_from={init.path} has another vocabulary than the tokenizer already in "
                f"{path} ({existing.src_vocab_size} vs {tokenizer.src_vocab_size} source "
                "entries, or other subwords); fine-tune into a fresh run directory"
            )
        return existing
    tokenizer.save(run_dir)
    return tokenizer


def check_parts(model: nn.Module, parts: Sequence[str]) -> list[nn.Module]:
    """The submodules ``freeze`` names; an unknown name is one error line listing the choices."""
    found: list[nn.Module] = []
    names = dict(model.named_modules())
    for part in parts:
        paths = PARTS.get(str(part), (str(part),))
        missing = [p for p in paths if p not in names]
        if missing or not str(part):
            raise UserError(
                f"freeze names a part that does not exist: {part!r}; choose from "
                f"{', '.join(PARTS)} or a submodule path such as encoder.layers.0 "
                "(print(model) lists them)"
            )
        found.extend(names[p] for p in paths)
    return found


class FreezeParts(BaseFinetuning):
    """Keep the named parts of the model at their starting weights for the whole run."""

    def __init__(self, parts: Sequence[str]) -> None:
        super().__init__()
        self.parts = [str(p) for p in parts]

    def freeze_before_training(self, pl_module: pl.LightningModule) -> None:
        modules = check_parts(pl_module.model, self.parts)
        self.freeze(modules, train_bn=True)
        frozen = sum(p.numel() for p in pl_module.parameters() if not p.requires_grad)
        log.info("frozen: %s (%s parameters)", ", ".join(self.parts), f"{frozen:,}")

    def finetune_function(self, pl_module: pl.LightningModule, epoch: int, optimizer: Any) -> None:
        """Nothing is unfrozen during the run."""
