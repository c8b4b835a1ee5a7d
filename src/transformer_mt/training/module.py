"""TranslationModule: the Lightning wrapper (loss, optimizer, schedule, metrics) that trains
and scores the plain Transformer, which knows nothing about Lightning."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable
from dataclasses import asdict
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.trainer.states import TrainerFn
from torch import Tensor

from transformer_mt.checkpoint import CHECKPOINT_KEY, write_metadata
from transformer_mt.data.tokenizer import UNK_ID, Tokenizer
from transformer_mt.inference.decode import best_tokens
from transformer_mt.inference.engine import TorchEngine
from transformer_mt.inference.metrics import corpus_scores
from transformer_mt.model.transformer import ModelConfig, Transformer
from transformer_mt.training.budget import find_budget
from transformer_mt.training.callbacks import stop_if_diverged
from transformer_mt.training.config import TrainingConfig
from transformer_mt.training.loss import (
    label_smoothed_loss,
    target_word_dropout,
)
from transformer_mt.training.schedules import lr_factor
from transformer_mt.training.step import (
    StepWindow,
    check_at_once,
    clip_without_scaler,
    is_log_step,
    nonfinite_error,
)

log = logging.getLogger(__name__)


class TranslationModule(pl.LightningModule):
    """Trains a :class:`Transformer` with label smoothing and a warmup schedule; scores BLEU.

    Args:
        config: the model's sizes (vocabulary sizes and pad id from the tokenizer).
        optimizer: a partial optimizer constructor (Hydra ``_partial_: true``) taking the
            parameters; its ``lr`` is the peak learning rate.
        training: schedule, loss, examples and the decoding of validation/test BLEU.
        tokenizer: turns hypotheses into text for BLEU; ``None`` scores losses only.

    Checkpoints hold all a checkpoint needs to translate alone and to rebuild its test split.
    """

    def __init__(
        self,
        config: ModelConfig,
        *,
        optimizer: Callable[[Iterable[Tensor]], torch.optim.Optimizer],
        training: TrainingConfig | None = None,
        tokenizer: Tokenizer | None = None,
    ) -> None:
        super().__init__()
        self.config = config
        self.model = Transformer(config)
        self.optimizer_factory = optimizer
        self.training_config = training if training is not None else TrainingConfig()
        self.search = self.training_config.decoding
        self.tokenizer = tokenizer
        self._window = StepWindow()  # training metrics, read at log steps only
        self._eval_outputs: list[tuple[int, str, str, str]] = []
        self._eval_loss = [0.0, 0]  # nll sum, tokens
        self._eval_smoothed = [0.0, 0]  # smoothed loss sum (token-weighted), tokens
        self.skipped_batches = 0
        self._skipped_in_a_row = 0

    # ------------------------------------------------------------------ training

    def forward(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        return self.model(src, tgt_in)

    def _loss(self, batch: dict[str, Any]) -> tuple[Tensor, Tensor, Tensor]:
        tgt = batch["tgt"]
        tgt_in = tgt[:, :-1]
        settings = self.training_config
        if self.training and settings.word_dropout > 0:
            tgt_in = target_word_dropout(
                tgt_in,
                settings.word_dropout,
                settings.word_dropout_mode,
                pad_id=self.config.pad_id,
                unk_id=UNK_ID,
            )
        logits = self.model(batch["src"], tgt_in)  # (B, T, V)
        return label_smoothed_loss(logits, tgt[:, 1:], self.config.pad_id, settings.label_smoothing)

    def on_train_start(self) -> None:
        self._window.reset()

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> Tensor | None:
        loss, nll_sum, n_tokens = self._loss(batch)
        if check_at_once(self.device, self.training_config.nonfinite_loss):
            if not torch.isfinite(loss):
                if self.training_config.nonfinite_loss == "skip":
                    self.skipped_batches += 1
                    self._skipped_in_a_row += 1
                    stop_if_diverged(self.model, loss, self.global_step, self._skipped_in_a_row)
                    log.warning(
                        "non-finite loss at step %d: batch skipped (%d so far)",
                        self.global_step,
                        self.skipped_batches,
                    )
                    return None
                raise nonfinite_error(f"{loss.item()} at step {self.global_step}")
            self._skipped_in_a_row = 0
            finite = None
        else:
            finite = torch.isfinite(loss.detach())
        self._window.add(nll_sum, n_tokens, finite)  # device-side sums: no host sync here
        if is_log_step(self._trainer):
            # sync_dist: under DDP the logged loss is the mean over ranks, not rank 0's share.
            self.log("train/loss", loss.detach(), prog_bar=True, batch_size=1, sync_dist=True)
            for name, value in self._window.take(self.global_step).items():
                self.log(name, value, prog_bar=name.endswith("per_sec"), batch_size=1)
        return loss

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        # After the scheduler's step: the learning rate the next step will use.
        if is_log_step(self._trainer) and self.trainer.optimizers:
            self.log("train/lr", self.trainer.optimizers[0].param_groups[0]["lr"], batch_size=1)

    def configure_gradient_clipping(
        self,
        optimizer: torch.optim.Optimizer,
        gradient_clip_val: Any = None,
        gradient_clip_algorithm: Any = None,
    ) -> None:
        """As configured; under bf16-mixed also with a fused optimizer (see training/step.py)."""
        clip, algorithm = gradient_clip_val, gradient_clip_algorithm
        if not clip_without_scaler(self, self.trainer.precision_plugin, clip, algorithm):
            super().configure_gradient_clipping(optimizer, clip, algorithm)

    def configure_optimizers(self) -> Any:
        optimizer = self.optimizer_factory(self.parameters())
        warmup = self.training_config.warmup_steps
        schedule = self.training_config.lr_schedule
        total = self.planned_steps() if schedule != "inverse_sqrt" else None
        budget = find_budget(self._trainer)  # a trainer.max_time horizon (training/budget.py)
        timed = budget is not None and budget.seconds is not None
        if budget is not None:
            # A budget shorter than the warmup would stop while the lr is still rising.
            warmup = budget.capped_warmup(warmup, total)

        def factor(step: int) -> float:
            # LambdaLR counts from 0 before the first step; the paper's counter starts at 1.
            if not timed:
                return lr_factor(step + 1, warmup, schedule, total)
            assert budget is not None
            progress = budget.progress(step + 1, warmup)
            warm = budget.warmup_progress(step + 1, warmup)
            return lr_factor(step + 1, warmup, schedule, total, progress, warmup_progress=warm)

        # A run without any budget fails here, before training.
        lr_factor(1, warmup, schedule, total, 0.0 if timed else None)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": scheduler, "interval": "step", "frequency": 1},
        }

    def planned_steps(self) -> int | None:
        """Optimizer steps this fit will take: ``max_steps`` or ``max_epochs`` x steps/epoch.

        Counted from the batch sampler: Lightning's ``estimated_stepping_batches`` builds the
        loader before a restore, which then skips the loader's position on a mid-epoch resume.
        """
        trainer = self.trainer
        max_steps = trainer.max_steps if trainer.max_steps not in (None, -1) else None
        datamodule = getattr(trainer, "datamodule", None)
        if datamodule is None or not hasattr(datamodule, "batch_sampler"):
            estimated = trainer.estimated_stepping_batches  # a plain loader: Lightning counts
            return int(estimated) if math.isfinite(estimated) else None
        by_epochs = None
        if trainer.max_epochs not in (None, -1):
            batches = len(datamodule.batch_sampler("train"))
            limit = trainer.limit_train_batches
            if isinstance(limit, int):
                batches = min(batches, limit)
            elif limit is not None:
                batches = int(batches * float(limit))
            per_epoch = math.ceil(batches / max(trainer.accumulate_grad_batches, 1))
            by_epochs = int(trainer.max_epochs) * per_epoch
        planned = [n for n in (max_steps, by_epochs) if n is not None]
        return min(planned) if planned else None

    # ------------------------------------------------------------------ evaluation

    def _eval_start(self) -> None:
        self._eval_outputs = []
        self._eval_loss = [0.0, 0]
        self._eval_smoothed = [0.0, 0]

    def _eval_step(self, batch: dict[str, Any]) -> None:
        loss, nll_sum, n_tokens = self._loss(batch)
        self._eval_loss[0] += float(nll_sum)
        self._eval_loss[1] += int(n_tokens)
        self._eval_smoothed[0] += float(loss) * int(n_tokens)
        self._eval_smoothed[1] += int(n_tokens)
        if self.tokenizer is None:
            return
        # The decode loop of evaluate.py and translate, a batch at a time; _eval_end reorders.
        engine = TorchEngine(self.model, bos_id=self.tokenizer.bos_id, eos_id=self.tokenizer.eos_id)
        # The search runs in the weights' dtype, as those commands do: a bf16 search would
        # score what no command makes, and on a CPU grow a compiled kernel per shape.
        with torch.autocast(self.device.type, enabled=False):
            hyp_ids = best_tokens(engine.decode_batch(batch, self.search))
        hyps = self.tokenizer.decode_hypotheses(hyp_ids)
        for i, src, ref, hyp in zip(
            batch["index"].tolist(), batch["src_text"], batch["tgt_text"], hyps
        ):
            self._eval_outputs.append((int(i), src, ref, hyp))

    def _gather(self, items: list[Any]) -> list[Any]:
        world = self.trainer.world_size if self._trainer is not None else 1
        if world > 1 and torch.distributed.is_available() and torch.distributed.is_initialized():
            gathered: list[Any] = [None] * world
            torch.distributed.all_gather_object(gathered, items)
            return [item for part in gathered for item in part]
        return items

    def _eval_end(self, stage: str) -> dict[str, float]:
        sums = self._gather([(self._eval_loss[0], self._eval_loss[1], self._eval_smoothed[0])])
        nll = sum(s[0] for s in sums)
        tokens = sum(s[1] for s in sums)
        smoothed = sum(s[2] for s in sums)
        metrics: dict[str, float] = {}
        if tokens:
            metrics[f"{stage}/loss"] = smoothed / tokens
            metrics[f"{stage}/nll"] = nll / tokens
            metrics[f"{stage}/ppl"] = math.exp(min(nll / tokens, 50.0))
        outputs = self._gather(self._eval_outputs)
        if outputs:
            # DDP ranks may pad with repeated batches; keep one output per example, in order.
            by_index = {i: (src, ref, hyp) for i, src, ref, hyp in outputs}
            indices = sorted(by_index)
            ordered = [by_index[i] for i in indices]
            metrics.update(self._scores(stage, indices, ordered))
            if self.trainer.is_global_zero and not self.trainer.sanity_checking:
                for src, ref, hyp in ordered[: self.training_config.num_examples]:
                    log.info("[%s] src: %s\n        ref: %s\n        hyp: %s", stage, src, ref, hyp)
        for name, value in metrics.items():
            # Values are already global (gathered above): no further reduction across ranks.
            self.log(name, value, prog_bar=name.endswith(("bleu", "loss")), rank_zero_only=False)
        return metrics

    def _scores(
        self, stage: str, indices: list[int], ordered: list[tuple[str, str, str]]
    ) -> dict[str, float]:
        """BLEU, lowercased and tokenized BLEU and chrF of the split; with several directions
        each direction's (``val/bleu/de-en``) and their mean as ``val/bleu`` (what
        checkpointing and pruning watch), so every direction counts alike."""
        names = ("bleu", "bleu_lc", "bleu_tok", "chrf")
        directions = self._row_directions(stage)
        if directions is None:
            scores = corpus_scores(
                [o[2] for o in ordered], [o[1] for o in ordered], lang=self._target_language()
            )
            return {f"{stage}/{n}": getattr(scores, n) for n in names}
        groups: dict[str, list[tuple[str, str]]] = {}
        for i, (_, ref, hyp) in zip(indices, ordered):
            groups.setdefault(directions[i], []).append((hyp, ref))
        metrics: dict[str, float] = {}
        per = {
            d: corpus_scores([h for h, _ in rows], [r for _, r in rows], lang=d.split("-", 1)[1])
            for d, rows in sorted(groups.items())
        }
        for n in names:
            for d, scores in per.items():
                metrics[f"{stage}/{n}/{d}"] = getattr(scores, n)
            metrics[f"{stage}/{n}"] = sum(getattr(sc, n) for sc in per.values()) / len(per)
        return metrics

    def _row_directions(self, stage: str) -> list[str] | None:
        """The direction of each row of the split being scored, for a multilingual corpus."""
        data = getattr(self._trainer, "datamodule", None) if self._trainer else None
        split = (getattr(data, "splits", None) or {}).get("validation" if stage == "val" else stage)
        if split is None or "direction" not in split.column_names:
            return None
        return list(split["direction"])

    def _target_language(self) -> str:
        """The language bleu_tok tokenises for: the data's target, else the tokenizer's."""
        data = getattr(self._trainer, "datamodule", None) if self._trainer else None
        lang = getattr(getattr(data, "config", None), "tgt_lang", None)
        return lang or getattr(self.tokenizer, "tgt_lang", None) or "en"

    def on_validation_epoch_start(self) -> None:
        self._eval_start()

    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        self._eval_step(batch)

    def on_validation_epoch_end(self) -> None:
        self._eval_end("val")

    def on_test_epoch_start(self) -> None:
        self._eval_start()

    def test_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        self._eval_step(batch)

    def on_test_epoch_end(self) -> None:
        self._eval_end("test")

    # ------------------------------------------------------------------ checkpoints

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # All needed to translate with this checkpoint alone (checkpoint.py).
        data = getattr(self._trainer, "datamodule", None) if self._trainer else None
        data_config = getattr(data, "config", None)
        tokenizer = self.tokenizer
        extra = write_metadata(
            checkpoint,
            self.config,
            tokenizer,
            src_lang=data_config.src_lang if data_config else getattr(tokenizer, "src_lang", None),
            tgt_lang=data_config.tgt_lang if data_config else getattr(tokenizer, "tgt_lang", None),
            decoding=self._stored_decoding(),
            data=data_config.stored() if data_config else None,
        )
        # Dropout draws from the global RNG, which Lightning does not save: resume identically.
        extra["torch_rng_state"] = torch.get_rng_state()

    def _stored_decoding(self) -> dict[str, Any]:
        """The search options of validation BLEU, the defaults of evaluate.py and translate."""
        options = asdict(self.search)
        options.pop("use_cache")  # how to compute, not what: left to each reader
        return options

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        extra = checkpoint.get(CHECKPOINT_KEY) or {}
        if self.tokenizer is None and extra.get("tokenizer"):
            self.tokenizer = Tokenizer.from_json(extra["tokenizer"])
        rng_state = extra.get("torch_rng_state")
        fitting = self._trainer is not None and self.trainer.state.fn == TrainerFn.FITTING
        if rng_state is not None and fitting:
            torch.set_rng_state(rng_state)
