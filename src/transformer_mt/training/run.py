"""The training pipeline behind train.py: data -> model -> module -> callbacks -> Trainer."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import warnings
from pathlib import Path
from typing import Any

import hydra
import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import ProgressBar
from omegaconf import DictConfig

from transformer_mt.data.datamodule import TranslationDataModule
from transformer_mt.errors import NonFiniteLossError, TrainingInterrupted
from transformer_mt.model.transformer import ModelConfig
from transformer_mt.provenance import peak_resident_bytes, write_run_info
from transformer_mt.training.average import average_path, check_average_last, write_average
from transformer_mt.training.budget import TrainingBudget, validation_interval
from transformer_mt.training.callbacks import (
    AtomicCheckpointIO,
    KeepValidationClock,
    StopAtStepBoundary,
    is_interrupt,
)
from transformer_mt.training.checks import (
    check_free_space,
    check_max_len,
    check_resume_checkpoint,
    check_resume_matches,
    check_settings,
)
from transformer_mt.training.config import TrainSchema, model_settings, train_settings
from transformer_mt.training.finetune import FineTuneStart, FreezeParts, check_parts, finetune_start
from transformer_mt.training.module import TranslationModule
from transformer_mt.training.precision import resolve_precision
from transformer_mt.training.pruning import (
    TrialPruning,
    one_trial_per_process_group,
    rerun_as_one_job,
    trial_from_hydra,
)
from transformer_mt.training.rundir import claim_run_dir, release_run_dir

log = logging.getLogger(__name__)


def model_config_from(model: Any, src_vocab: int, tgt_vocab: int, pad_id: int) -> ModelConfig:
    """ModelConfig from the model group's settings plus the sizes the tokenizer decided."""
    values = model_settings(model)
    values.update(src_vocab_size=src_vocab, tgt_vocab_size=tgt_vocab, pad_id=pad_id)
    return ModelConfig.from_dict(values)


#: Lightning lines that say nothing about this run: its "Tip:" adverts and the note that
#: training/summary.py replaces its model summary.
_CHATTER = ("💡 Tip:", "Trainer already configured with model summary callbacks")


def _not_chatter(record: logging.LogRecord) -> bool:
    return not str(record.msg).startswith(_CHATTER)


def route_lightning_logs() -> None:
    """Each Lightning log line once, through the handlers Hydra configured, without chatter.

    Lightning's console handler goes when the root logger has handlers (Hydra's), which
    would print every line twice; outside Hydra Lightning keeps its own.
    """
    if logging.getLogger().handlers:
        for name in ("lightning", "lightning.pytorch", "lightning.fabric"):
            logger = logging.getLogger(name)
            for handler in list(logger.handlers):
                if type(handler) is logging.StreamHandler:  # its console, not a file of ours
                    logger.removeHandler(handler)
            logger.propagate = True
    rank_zero = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    if _not_chatter not in rank_zero.filters:
        rank_zero.addFilter(_not_chatter)
    # Lightning's own use of a torch API that torch deprecates: nothing a user can change.
    warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated")


def _instantiate_all(section: dict[str, Any]) -> list[Any]:
    return [hydra.utils.instantiate(v) for v in section.values() if v is not None]


def run_callbacks(cfg: TrainSchema) -> list[Any]:
    """The configured callbacks plus those every run has: budget, clean stop, trial pruning."""
    callbacks = _instantiate_all(cfg.callbacks)
    if not any(isinstance(cb, TrainingBudget) for cb in callbacks):
        # trainer.max_time becomes the lr horizon; the warmup and the final validation fit in it.
        callbacks.append(TrainingBudget(**dataclasses.asdict(cfg.budget)))
    # Ctrl-C / SIGTERM stop at the end of a step: the saved checkpoint resumes bit-identically.
    callbacks.append(StopAtStepBoundary())
    # In an Optuna trial: report val/bleu and stop when pruned (under DDP, all ranks together).
    callbacks.append(TrialPruning(trial_from_hydra(), monitor=cfg.optimized_metric or "val/bleu"))
    return callbacks


def prepare_data(
    cfg: TrainSchema, run_dir: Path, start: FineTuneStart | None = None
) -> TranslationDataModule:
    """The data module with its tokenizer trained (or read, or taken from ``init_from``) in
    ``run_dir`` and its splits ready; before :func:`build`, which needs the vocabulary sizes."""
    datamodule = TranslationDataModule(
        cfg.data.config(),
        work_dir=run_dir,
        model_max_len=start.model_config.max_len if start else cfg.model.max_len,
        tokenizer=start.tokenizer if start else None,
    )
    datamodule.prepare_data()
    datamodule.setup("fit")
    return datamodule


def build_module(
    cfg: TrainSchema, datamodule: TranslationDataModule, start: FineTuneStart | None = None
) -> TranslationModule:
    """The Lightning module for the prepared data: vocabulary sizes come from its tokenizer
    (model shape and weights from ``init_from`` when fine-tuning)."""
    model_config = start.model_config if start else model_config_from(
        cfg.model, datamodule.src_vocab_size, datamodule.tgt_vocab_size, datamodule.pad_id
    )  # fmt: skip
    check_max_len(cfg.data.max_len, model_config.max_len)
    module = TranslationModule(
        model_config,
        optimizer=hydra.utils.instantiate(cfg.optimizer),
        training=cfg.module,
        tokenizer=datamodule.tokenizer,
    )
    if start is not None:
        start.load_weights(module.model)
    log.info(
        "model: %s parameters (d_model=%d, %d+%d layers, vocab %d/%d)",
        f"{module.model.num_parameters():,}",
        model_config.d_model,
        model_config.n_encoder_layers,
        model_config.n_decoder_layers,
        model_config.src_vocab_size,
        model_config.tgt_vocab_size,
    )
    return module


def build_callbacks(cfg: TrainSchema, module: TranslationModule) -> list[Any]:
    """:func:`run_callbacks`, the freeze of ``init_from`` fine-tuning, and no progress bar
    when the trainer has none."""
    callbacks = run_callbacks(cfg)
    if cfg.freeze:
        check_parts(module.model, cfg.freeze)  # a wrong name fails before the Trainer
        callbacks.append(FreezeParts(cfg.freeze))
    if cfg.trainer.get("enable_progress_bar") is False:
        callbacks = [cb for cb in callbacks if not isinstance(cb, ProgressBar)]
    return callbacks


def build_trainer(cfg: TrainSchema, module: TranslationModule) -> pl.Trainer:
    """The Trainer with the configured callbacks, loggers, atomic checkpoints and precision."""
    callbacks = build_callbacks(cfg, module)
    check_free_space(Path(cfg.run_dir), module, callbacks)
    extra: dict[str, Any] = {}
    budget = next(cb for cb in callbacks if isinstance(cb, TrainingBudget))
    if budget.validations:
        # At fixed fractions of the budget, whatever its length (training/budget.py).
        interval = validation_interval(cfg.trainer.get("max_time"), budget.validations)
        extra["val_check_interval"] = interval
        log.info(
            "validation every %s (budget.validations=%d; trainer.val_check_interval is not used)",
            interval,
            budget.validations,
        )
    loggers = _instantiate_all(cfg.logger)
    # Atomic checkpoint writes: kill -9 leaves the previous last.ckpt intact (callbacks.py).
    plugins = list(cfg.trainer.get("plugins") or [])
    if not any(isinstance(p, AtomicCheckpointIO) for p in plugins):
        plugins.append(AtomicCheckpointIO())
    # trainer.precision=auto: what this machine runs fastest (training/precision.py).
    choice = resolve_precision(
        cfg.trainer.get("precision"),
        cfg.trainer.get("accelerator"),
        module.model,
        batch_tokens=cfg.data.max_tokens,
    )
    log.info("precision: %s (%s)", choice.precision, choice.reason)
    # A sweep trial under DDP: Lightning starts the other ranks as this job, not as the sweep.
    rerun_as_one_job()
    data = cfg.data.config()
    if data.bpe_dropout > 0 or data.resamples_directions:
        # Each epoch's BPE-dropout segmentation or draw of directions needs a new loader.
        extra["reload_dataloaders_every_n_epochs"] = 1
        callbacks.append(KeepValidationClock())
    return hydra.utils.instantiate(
        cfg.trainer,
        **extra,
        callbacks=callbacks,
        logger=loggers or False,
        plugins=plugins,
        precision=choice.precision,
        # callbacks.progress_bar=null means none, not Lightning's default bar in a log file.
        enable_progress_bar=any(isinstance(cb, ProgressBar) for cb in callbacks),
    )


def build(
    cfg: TrainSchema, datamodule: TranslationDataModule, start: FineTuneStart | None = None
) -> tuple[TranslationModule, pl.Trainer]:
    """Lightning module and Trainer from a composed config and the prepared data; writes
    nothing."""
    module = build_module(cfg, datamodule, start)
    return module, build_trainer(cfg, module)


def prepare_and_build(
    cfg: DictConfig | TrainSchema,
) -> tuple[TranslationDataModule, TranslationModule, pl.Trainer]:
    """What a run does before ``fit`` (seed, data, module, Trainer), for tools that drive the
    fit themselves."""
    cfg = train_settings(cfg)
    check_settings(cfg)  # what the config alone decides, before any data work
    run_dir = Path(cfg.run_dir)
    start = finetune_start(cfg, run_dir)  # init_from: the checkpoint's weights and tokenizer
    pl.seed_everything(cfg.seed, workers=True, verbose=False)
    datamodule = prepare_data(cfg, run_dir, start)
    return (datamodule, *build(cfg, datamodule, start))


def last_checkpoint(trainer: pl.Trainer) -> str | None:
    """The newest ``last.ckpt``-style file the trainer's checkpoint callbacks wrote, if any."""
    paths = [
        Path(cb.last_model_path)
        for cb in trainer.checkpoint_callbacks
        if getattr(cb, "last_model_path", None)
    ]
    existing = [p for p in paths if p.is_file()]
    return str(max(existing, key=lambda p: p.stat().st_mtime)) if existing else None


def resume_command(ckpt: str) -> str:
    """The command line that resumes this run from ``ckpt`` (same overrides, new ckpt_path)."""
    overrides: list[str] = []
    try:
        from hydra.core.hydra_config import HydraConfig

        overrides = [o for o in HydraConfig.get().overrides.task if not o.startswith("ckpt_path=")]
    except ValueError:  # not launched through @hydra.main (tests, notebooks)
        pass
    return " ".join(["python train.py", *overrides, f"ckpt_path={ckpt}"])


def fit(trainer: pl.Trainer, module: TranslationModule, datamodule: Any, ckpt: Any) -> None:
    """``trainer.fit`` with the two ways it can stop early turned into clear errors.

    Raises:
        TrainingInterrupted: Ctrl-C or SIGTERM; Lightning has saved last.ckpt (see
            SafeModelCheckpoint), the message says how to resume.
        NonFiniteLossError: the loss diverged; the message gains the last good checkpoint.
    """
    stopper = next((cb for cb in trainer.callbacks if isinstance(cb, StopAtStepBoundary)), None)
    signals = stopper.handling_signals() if stopper is not None else contextlib.nullcontext()
    try:
        with signals:
            trainer.fit(module, datamodule=datamodule, ckpt_path=ckpt)
    except SystemExit:  # Lightning exits 1 after handling KeyboardInterrupt / SIGTERM
        if not trainer.interrupted:
            raise
        raise _interrupted(trainer) from None
    except NonFiniteLossError as exc:
        saved = last_checkpoint(trainer)
        where = (
            f"last good checkpoint: {saved} (finite weights; resuming restores its learning "
            "rate, so for a lower optimizer.lr start a fresh run)"
            if saved
            else "no checkpoint was written before it"
        )
        raise NonFiniteLossError(f"{exc}; {where}") from None
    except OSError as exc:  # disk full, permissions: a user error, nothing lost
        saved = last_checkpoint(trainer)
        where = (
            f"resume with: {resume_command(saved)}"
            if saved
            else "no checkpoint of this run was written; start it again"
        )
        raise OSError(f"{' '.join(str(exc).split())}; {where}") from None
    except Exception as exc:
        if is_interrupt(exc):  # Ctrl-C inside torch.save surfaces as a RuntimeError
            raise _interrupted(trainer) from None
        raise


def _interrupted(trainer: pl.Trainer) -> TrainingInterrupted:
    """The error for a stopped run, naming the checkpoint to resume from."""
    saved = last_checkpoint(trainer)
    if saved is None:
        return TrainingInterrupted(
            f"training interrupted at step {trainer.global_step} before any checkpoint was "
            "written; start it again"
        )
    return TrainingInterrupted(
        f"training interrupted at step {trainer.global_step}; resumable checkpoint saved: "
        f"{saved}; resume with: {resume_command(saved)}"
    )


def run(cfg: DictConfig | TrainSchema, metrics: dict[str, float] | None = None) -> float | None:
    """Train, test the best checkpoint, print a summary; return ``cfg.optimized_metric`` (what a
    sweep reads) and put the summary's validation and test metrics into ``metrics``."""
    cfg = train_settings(cfg)
    if "WANDB_API_KEY" not in os.environ:
        # Without a key wandb would prompt or hang; offline files can be synced later.
        os.environ.setdefault("WANDB_MODE", "offline")
    os.environ.setdefault("WANDB_SILENT", "true")
    torch.set_float32_matmul_precision("high")
    route_lightning_logs()
    if cfg.threads:
        torch.set_num_threads(cfg.threads)

    run_dir = Path(cfg.run_dir)
    # One run per directory; a no-op when RunDirGuard has claimed it (Hydra single runs).
    claimed = claim_run_dir(run_dir)
    try:
        with one_trial_per_process_group():
            return _run(cfg, run_dir, {} if metrics is None else metrics)
    finally:
        if claimed:
            release_run_dir(run_dir)


def _hydra_overrides() -> list[str] | None:
    """The command-line overrides of a run Hydra started (``None`` for direct callers)."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return None
    return list(HydraConfig.get().overrides.task)


def _run(cfg: TrainSchema, run_dir: Path, metrics: dict[str, float]) -> float | None:
    check_average_last(cfg.average_last, cfg.callbacks)
    resumed = check_resume_checkpoint(cfg.ckpt_path, cfg.callbacks)  # before any data
    datamodule, module, trainer = prepare_and_build(cfg)
    if resumed is not None:
        check_resume_matches(resumed, datamodule.tokenizer, module.config, run_dir)
        del resumed
    if trainer.is_global_zero:  # the machine, code and command beside the results
        write_run_info(run_dir, _hydra_overrides())
    for logger in trainer.loggers:  # the whole composed config, for comparing runs and sweeps
        logger.log_hyperparams(dataclasses.asdict(cfg))
    fit(trainer, module, datamodule, cfg.ckpt_path)
    val_metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}

    checkpoint_cb = trainer.checkpoint_callback
    best_path = getattr(checkpoint_cb, "best_model_path", "") or ""
    test_metrics: dict[str, float] = {}
    pruning = next((cb for cb in trainer.callbacks if isinstance(cb, TrialPruning)), None)
    pruned = pruning is not None and pruning.pruned_at is not None  # no test for a pruned trial
    if cfg.average_last and not pruned and not trainer.fast_dev_run:
        # The average is the run's result: validated (the sweep's metric), then tested.
        if trainer.is_global_zero:
            write_average(run_dir, cfg.average_last)
        trainer.strategy.barrier()
        best_path = str(average_path(run_dir, cfg.average_last))
        results = trainer.validate(
            module, datamodule=datamodule, ckpt_path=best_path, verbose=False
        )
        val_metrics.update({k: float(v) for k, v in (results[0] if results else {}).items()})
    if cfg.test_after_fit and not trainer.fast_dev_run and not pruned:
        results = trainer.test(
            module, datamodule=datamodule, ckpt_path=best_path or None, verbose=False
        )
        test_metrics = {k: float(v) for k, v in (results[0] if results else {}).items()}
    elif trainer.fast_dev_run:
        results = trainer.test(module, datamodule=datamodule, verbose=False)
        test_metrics = {k: float(v) for k, v in (results[0] if results else {}).items()}

    if trainer.is_global_zero:
        _print_summary(cfg, val_metrics, test_metrics, best_path, trainer)
    metrics.update(val_metrics | test_metrics)
    metric = cfg.optimized_metric
    if metric and metric in val_metrics:
        return val_metrics[metric]
    return None


def _print_summary(
    cfg: TrainSchema,
    val: dict[str, float],
    test: dict[str, float],
    best_path: str,
    trainer: pl.Trainer,
) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="transformer-mt: training summary", show_header=False)
    table.add_column()
    table.add_column(overflow="fold")  # long paths wrap instead of ending in "..."
    best = getattr(trainer.checkpoint_callback, "best_model_score", None)
    if best is not None:
        table.add_row("best val/bleu", f"{float(best):.2f}")
    averaged = bool(cfg.average_last) and Path(best_path).name.startswith("average-last")
    for key in ("val/bleu", "val/bleu_tok", "val/chrf", "val/loss"):
        if key in val:
            table.add_row(f"{'average' if averaged else 'last'} {key}", f"{val[key]:.3f}")
    for key in ("test/bleu", "test/bleu_lc", "test/bleu_tok", "test/chrf", "test/loss"):
        if key in test:
            table.add_row(key, f"{test[key]:.3f}")
    table.add_row("run dir", str(cfg.run_dir))
    validated = any(key.startswith("val/") for key in val)
    no_best = "-" if validated else "- (the run ended before its first validation)"
    if averaged:
        # The result of the run: what was tested, and what to evaluate and export.
        table.add_row(f"average of the last {cfg.average_last}", best_path)
    else:
        table.add_row("best checkpoint", best_path or no_best)
    last = last_checkpoint(trainer)  # the file this run wrote, not a last.ckpt of another run
    if last is not None:
        table.add_row("last checkpoint", last)
    peak = peak_resident_bytes()
    if peak is not None:
        table.add_row("peak memory", f"{peak / 1e9:.2f} GB resident (this process)")
    Console(stderr=False).print(table)
