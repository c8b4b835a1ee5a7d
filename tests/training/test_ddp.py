"""Distributed data parallel on CPU: ``trainer=ddp`` with two gloo processes.

Lightning's DDP launcher re-runs the command line for each extra rank, so the run
happens in a subprocess (``python train.py trainer=ddp ...``), once for the module.
:class:`BatchRecorder` (added with ``+callbacks.recorder``; importable because the
subprocess gets ``tests/`` on ``PYTHONPATH``) writes what every rank trained on.
"""

from __future__ import annotations

import csv
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch

from conftest import ROOT, TESTS

#: This folder: the subprocess imports test_ddp.BatchRecorder from it.
HERE = Path(__file__).resolve().parent

DATA = [
    "data.sizes.train=300",
    "data.sizes.validation=20",
    "data.sizes.test=20",
    "data.cache_dir=null",
]
MODEL = ["model.d_model=32", "model.d_ff=64", "model.n_heads=2"]


class BatchRecorder(pl.Callback):
    """Write ``rank{r}.json``: per training batch, its example indices and loss."""

    def __init__(self, out_dir: str) -> None:
        self.out_dir = Path(out_dir)
        self.batches: list[dict[str, Any]] = []

    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        self.batches.append(
            {"batch_idx": batch_idx, "index": batch["index"].tolist(), "loss": float(loss)}
        )

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        record = {
            "rank": trainer.global_rank,
            "world_size": trainer.world_size,
            "backend": getattr(trainer.strategy, "process_group_backend", None),
            "batches": self.batches,
        }
        (self.out_dir / f"rank{trainer.global_rank}.json").write_text(json.dumps(record))


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Train one epoch with two CPU processes; return the run directory."""
    run_dir = tmp_path_factory.mktemp("ddp")
    env = dict(
        os.environ,
        OMP_NUM_THREADS="1",
        WANDB_MODE="offline",
        HYDRA_FULL_ERROR="1",
        PYTHONPATH=os.pathsep.join(
            filter(None, [str(HERE), str(TESTS), os.environ.get("PYTHONPATH")])
        ),
    )
    command = [
        sys.executable,
        "train.py",
        "threads=1",
        "trainer=ddp",
        "trainer.accelerator=cpu",
        "trainer.devices=2",
        "trainer.max_epochs=1",
        "trainer.log_every_n_steps=1",
        "trainer.enable_model_summary=false",
        "callbacks=none",
        "+callbacks.recorder._target_=test_ddp.BatchRecorder",
        f"+callbacks.recorder.out_dir={run_dir / 'recorded'}",
        *DATA,
        *MODEL,
        f"hydra.run.dir={run_dir}",
    ]
    proc = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n--- stderr\n{proc.stderr[-6000:]}"
    return run_dir


def _recorded(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads((run_dir / "recorded" / f"rank{r}.json").read_text()) for r in (0, 1)]


def _metrics(run_dir: Path) -> list[dict[str, str]]:
    files = sorted(run_dir.rglob("metrics.csv"))
    assert len(files) == 1, f"one CSV log expected (rank 0 only), found {files}"
    with open(files[0], encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


@pytest.mark.slow
def test_ranks_train_on_disjoint_batches(ddp_run: Path) -> None:
    ranks = _recorded(ddp_run)
    assert [r["world_size"] for r in ranks] == [2, 2]
    assert ranks[0]["backend"] == "gloo"
    # Same number of steps on both ranks, or DDP would hang.
    assert len(ranks[0]["batches"]) == len(ranks[1]["batches"]) > 0
    seen = [{i for b in r["batches"] for i in b["index"]} for r in ranks]
    # Batches are dealt out, not duplicated; only the padding batches of an uneven
    # last round may repeat examples, so the overlap is at most one batch.
    overlap = seen[0] & seen[1]
    largest = max(len(b["index"]) for r in ranks for b in r["batches"])
    assert len(overlap) <= largest
    assert len(seen[0] | seen[1]) >= 290  # nearly all 300 pairs (a few may be filtered)


@pytest.mark.slow
def test_only_rank_zero_writes_checkpoints_and_logs(ddp_run: Path) -> None:
    checkpoints = sorted(p.name for p in (ddp_run / "checkpoints").iterdir())
    # Lightning saves on global rank 0 only; rank 1 would write the very same names.
    assert "last.ckpt" in checkpoints
    assert all(name.endswith(".ckpt") for name in checkpoints), checkpoints
    rows = _metrics(ddp_run)  # asserts a single metrics.csv
    steps = [int(r["step"]) for r in rows if r.get("train/loss")]
    assert steps == sorted(set(steps)), "one train/loss row per step: rank 0 alone logs"


@pytest.mark.slow
def test_logged_train_loss_is_the_global_mean(ddp_run: Path) -> None:
    ranks = _recorded(ddp_run)
    per_step = {
        b["batch_idx"]: (b["loss"] + c["loss"]) / 2
        for b, c in zip(ranks[0]["batches"], ranks[1]["batches"])
    }
    logged = {int(r["step"]): float(r["train/loss"]) for r in _metrics(ddp_run) if r["train/loss"]}
    assert logged
    for step, value in logged.items():
        assert math.isclose(value, per_step[step], rel_tol=1e-5), (step, value, per_step[step])


@pytest.mark.slow
def test_ddp_checkpoint_loads_safely_and_reproduces_val_loss(ddp_run: Path) -> None:
    """The checkpoint is plain data (weights_only=True) and evaluates to the logged val/loss."""
    from hydra import compose, initialize_config_dir
    from hydra.utils import instantiate

    from transformer_mt.data.tokenizer import Tokenizer
    from transformer_mt.model.transformer import ModelConfig, Transformer
    from transformer_mt.training.loss import label_smoothed_loss
    from transformer_mt.training.module import CHECKPOINT_KEY

    checkpoint = torch.load(ddp_run / "checkpoints" / "last.ckpt", weights_only=True)
    extra = checkpoint[CHECKPOINT_KEY]
    model = Transformer(ModelConfig.from_dict(extra["model_config"]))
    state = {k.removeprefix("model."): v for k, v in checkpoint["state_dict"].items()}
    model.load_state_dict(state)
    model.eval()
    tokenizer = Tokenizer.from_json(extra["tokenizer"])

    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        cfg = compose("train", overrides=DATA)
    from transformer_mt.data.datamodule import TranslationDataModule

    datamodule = TranslationDataModule(instantiate(cfg.data), tokenizer=tokenizer)
    datamodule.setup("validate")
    total, tokens = 0.0, 0
    with torch.no_grad():
        for batch in datamodule.val_dataloader():
            logits = model(batch["src"], batch["tgt"][:, :-1])
            loss, _, n = label_smoothed_loss(
                logits, batch["tgt"][:, 1:], tokenizer.pad_id, cfg.module.label_smoothing
            )
            total += float(loss) * int(n)
            tokens += int(n)
    val = [float(r["val/loss"]) for r in _metrics(ddp_run) if r.get("val/loss")]
    assert val, "no val/loss logged"
    assert math.isclose(total / tokens, val[-1], rel_tol=1e-4), (total / tokens, val[-1])
