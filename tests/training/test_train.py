"""Training: configs compose, a fit writes safe self-contained checkpoints; schedule, loss."""

from __future__ import annotations

import csv
import itertools
import math
from pathlib import Path

import hydra
import pytest
import torch
import torch.nn.functional as F
from omegaconf import OmegaConf

from transformer_mt.data.tokenizer import Tokenizer
from transformer_mt.model.transformer import ModelConfig, Transformer
from transformer_mt.training.config import TrainingConfig
from transformer_mt.training.loss import label_smoothed_loss
from transformer_mt.training.module import TranslationModule
from transformer_mt.training.precision import resolve_precision
from transformer_mt.training.run import model_config_from, run
from transformer_mt.training.schedules import inverse_sqrt_schedule, lr_factor, paper_peak_lr

from conftest import CONFIGS, FAST_TRAIN, compose_train

EXPERIMENTS = sorted(p.stem for p in (CONFIGS / "experiment").glob("*.yaml"))
MODELS = sorted(p.stem for p in (CONFIGS / "model").glob("*.yaml"))
TRAINERS = sorted(p.stem for p in (CONFIGS / "trainer").glob("*.yaml"))


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_every_experiment_composes_and_instantiates(tmp_path: Path, experiment: str) -> None:
    cfg = compose_train(tmp_path, [f"experiment={experiment}"])
    data_config = hydra.utils.instantiate(cfg.data)  # a DataConfig: nothing is loaded
    assert data_config.src_lang != data_config.tgt_lang
    model_config = model_config_from(cfg.model, 1000, 1000, 0)
    assert model_config.d_model % model_config.n_heads == 0
    optimizer = hydra.utils.instantiate(cfg.optimizer)
    assert optimizer(torch.nn.Linear(2, 2).parameters()).defaults["lr"] == cfg.optimizer.lr


#: Model configs whose one step takes more than a few seconds on a CPU (tens of M parameters).
LARGE_MODELS = ("base", "big")


@pytest.mark.parametrize(
    "model",
    [pytest.param(m, marks=[pytest.mark.slow] if m in LARGE_MODELS else []) for m in MODELS],
)
def test_every_model_config_builds(tmp_path: Path, model: str) -> None:
    """Each configs/model/*.yaml builds its Transformer and one SGD step lowers the loss."""
    cfg = compose_train(tmp_path, [f"model={model}"])
    vocab = 64  # the model's own sizes, a small vocabulary: the step stays cheap on a CPU
    config = model_config_from(cfg.model, vocab, vocab, 0)
    assert (config.d_model, config.n_heads) == (cfg.model.d_model, cfg.model.n_heads)
    torch.manual_seed(0)
    transformer = Transformer(config).eval()  # no dropout: the two losses are comparable
    src, tgt = torch.randint(4, vocab, (2, 7)), torch.randint(4, vocab, (2, 6))

    def loss() -> torch.Tensor:
        logits = transformer(src, tgt[:, :-1])
        assert logits.shape == (2, 5, vocab)
        return label_smoothed_loss(logits, tgt[:, 1:], config.pad_id, 0.1)[0]

    before = loss()
    before.backward()
    for name, parameter in transformer.named_parameters():
        assert parameter.grad is not None and bool(torch.isfinite(parameter.grad).all()), name
    torch.optim.SGD(transformer.parameters(), lr=1e-3).step()
    with torch.no_grad():
        assert float(loss()) < float(before)


def test_train_yaml_module_section_holds_the_training_config_defaults(tmp_path: Path) -> None:
    """train.yaml changes none of TrainingConfig's defaults (training/config.py)."""
    cfg = compose_train(tmp_path)
    assert OmegaConf.to_object(cfg.module) == TrainingConfig()


#: Parameter counts the YAML comments of configs/model/ state for a shared 37k vocabulary.
STATED_PARAMETERS = {"base": 63_082_496, "big": 214_245_376}


@pytest.mark.parametrize("model", sorted(STATED_PARAMETERS))
def test_paper_model_configs_have_the_stated_size(tmp_path: Path, model: str) -> None:
    cfg = compose_train(tmp_path, [f"model={model}"])
    with torch.device("meta"):  # sizes only: no memory, no initialisation
        transformer = Transformer(model_config_from(cfg.model, 37000, 37000, 0))
    assert transformer.num_parameters() == STATED_PARAMETERS[model]
    assert f"{STATED_PARAMETERS[model]:,}" in (CONFIGS / "model" / f"{model}.yaml").read_text()


@pytest.mark.parametrize("trainer", [t for t in TRAINERS if t not in ("gpu", "ddp")])
def test_trainer_configs_instantiate(tmp_path: Path, trainer: str) -> None:
    cfg = compose_train(tmp_path, [f"trainer={trainer}"])
    # precision=auto is ours (training/precision.py), resolved before Lightning sees it.
    trainer_cfg = cfg.trainer
    precision = resolve_precision(
        trainer_cfg.get("precision"), trainer_cfg.get("accelerator")
    ).precision
    t = hydra.utils.instantiate(
        cfg.trainer, logger=False, enable_checkpointing=False, precision=precision
    )
    assert t.max_epochs == cfg.trainer.max_epochs


def test_lr_schedule_matches_the_paper() -> None:
    d_model, warmup = 512, 4000
    peak = paper_peak_lr(d_model, warmup)
    assert peak == pytest.approx(7.0e-4, rel=0.01)
    for step in (1, 100, 3999, 4000, 4001, 10_000, 100_000):
        paper = d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)
        assert peak * inverse_sqrt_schedule(step, warmup) == pytest.approx(paper, rel=1e-9)


def test_scheduler_steps_every_optimizer_step() -> None:
    module = TranslationModule(
        ModelConfig(
            src_vocab_size=20,
            tgt_vocab_size=20,
            d_model=16,
            n_heads=2,
            d_ff=16,
            n_encoder_layers=1,
            n_decoder_layers=1,
        ),
        optimizer=lambda p: torch.optim.Adam(p, lr=2e-3),
        training=TrainingConfig(warmup_steps=10),
    )
    conf = module.configure_optimizers()
    opt, sched = conf["optimizer"], conf["lr_scheduler"]["scheduler"]
    assert conf["lr_scheduler"]["interval"] == "step"
    lrs = []
    for _ in range(20):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert lrs[0] == pytest.approx(2e-3 * 1 / 10)  # first step of the warmup
    assert lrs[9] == pytest.approx(2e-3)  # the peak at step == warmup
    assert lrs[19] == pytest.approx(2e-3 * math.sqrt(10 / 20))


@pytest.mark.parametrize("schedule", ["linear", "cosine"])
def test_decaying_schedules_warm_up_then_reach_zero_after_the_last_step(schedule: str) -> None:
    warmup, total = 10, 110
    factors = [lr_factor(step, warmup, schedule, total) for step in range(1, total + 1)]
    assert factors[:warmup] == pytest.approx([s / warmup for s in range(1, warmup + 1)])
    decay = factors[warmup:]
    assert all(a > b for a, b in itertools.pairwise(decay))  # strictly decreasing
    assert 0.0 < factors[-1] < 0.02  # the last step still learns a little
    assert lr_factor(total + 1, warmup, schedule, total) == pytest.approx(0.0, abs=1e-12)
    assert lr_factor(total + 50, warmup, schedule, total) == pytest.approx(0.0, abs=1e-12)
    halfway = factors[warmup + (total - warmup) // 2 - 1]
    assert halfway == pytest.approx(0.5, abs=0.03)


def test_decaying_schedule_without_a_horizon_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match=r"max_epochs or trainer\.max_steps"):
        lr_factor(1, 400, "linear", None)
    with pytest.raises(ValueError, match="choose one of"):
        lr_factor(1, 400, "step", 1000)


def test_linear_schedule_spans_the_trainer_run(tmp_path: Path) -> None:
    _, run_dir = _fit(
        tmp_path,
        "module.lr_schedule=linear",
        "module.warmup_steps=2",
        "optimizer.lr=1e-3",
        "trainer.max_epochs=2",
        "trainer.log_every_n_steps=1",
    )
    rows = list(csv.DictReader((run_dir / "csv" / "metrics.csv").open()))
    lrs = [float(r["train/lr"]) for r in rows if r.get("train/lr")]
    assert len(lrs) >= 6
    assert max(lrs) == pytest.approx(1e-3)  # the peak, reached after the 2 warmup steps
    # The horizon is the trainer's whole run (2 epochs), so the last steps are near zero.
    assert lrs[-1] < 0.2e-3
    assert lrs[len(lrs) // 2] > 0.3e-3


def test_label_smoothing_zero_is_plain_cross_entropy() -> None:
    logits = torch.randn(3, 5, 11)
    target = torch.randint(1, 11, (3, 5))
    target[0, 3:] = 0  # padding is ignored
    loss, nll_sum, n = label_smoothed_loss(logits, target, pad_id=0, label_smoothing=0.0)
    plain = F.cross_entropy(logits.reshape(-1, 11), target.reshape(-1), ignore_index=0)
    torch.testing.assert_close(loss, plain)
    assert int(n) == 13
    torch.testing.assert_close(nll_sum / n, plain)
    smoothed, _, _ = label_smoothed_loss(logits, target, pad_id=0, label_smoothing=0.1)
    assert not torch.allclose(smoothed, plain)


def test_label_smoothed_loss_and_gradient_match_torch_cross_entropy() -> None:
    logits = torch.randn(4, 6, 13, requires_grad=True)
    target = torch.randint(1, 13, (4, 6))
    target[1, 2:] = 0
    target[3, 5] = 0
    loss, nll_sum, n = label_smoothed_loss(logits, target, pad_id=0, label_smoothing=0.1)
    (grad,) = torch.autograd.grad(loss, logits)
    flat = logits.reshape(-1, 13)
    reference = F.cross_entropy(flat, target.reshape(-1), ignore_index=0, label_smoothing=0.1)
    (reference_grad,) = torch.autograd.grad(reference, logits)
    torch.testing.assert_close(loss, reference)
    torch.testing.assert_close(grad, reference_grad)
    nll = F.cross_entropy(flat, target.reshape(-1), ignore_index=0, reduction="sum")
    torch.testing.assert_close(nll_sum, nll.detach())
    assert int(n) == 24 - 4 - 1


def _fit(tmp_path: Path, *overrides: str) -> tuple[float | None, Path]:
    cfg = compose_train(tmp_path, [*FAST_TRAIN, *overrides])
    return run(cfg), tmp_path


def test_fit_writes_safe_self_contained_checkpoint(tmp_path: Path) -> None:
    metric, run_dir = _fit(tmp_path)
    assert metric is not None and 0.0 <= metric <= 100.0
    last = run_dir / "checkpoints" / "last.ckpt"
    ckpt = torch.load(last, weights_only=True, map_location="cpu")  # plain types only
    extra = ckpt["transformer_mt"]
    tokenizer = Tokenizer.from_json(extra["tokenizer"])
    assert tokenizer.src_vocab_size == extra["model_config"]["src_vocab_size"]
    assert extra["src_lang"] == "en" and extra["tgt_lang"] == "de"
    assert (run_dir / "tokenizer.json").is_file()
    metrics = (run_dir / "csv" / "metrics.csv").read_text()
    for name in (
        "train/loss",
        "train/lr",
        "train/tokens_per_sec",
        "val/bleu",
        "val/chrf",
        "test/bleu",
    ):
        assert name in metrics


def _weights(path: Path) -> dict[str, torch.Tensor]:
    return torch.load(path, weights_only=True, map_location="cpu")["state_dict"]


def test_resume_continues_and_matches_uninterrupted_run(tmp_path: Path) -> None:
    # Dropout on, so the resumed run must also continue the random stream.
    common = ["model.dropout=0.2", "trainer.max_epochs=2", "test_after_fit=false"]
    _fit(tmp_path / "full", *common)
    _fit(tmp_path / "part", *common[:1], "trainer.max_epochs=1", "test_after_fit=false")
    part = tmp_path / "part" / "checkpoints" / "last.ckpt"
    first_step = torch.load(part, weights_only=True)["global_step"]
    _fit(tmp_path / "resumed", *common, f"ckpt_path={part}")
    full = torch.load(tmp_path / "full" / "checkpoints" / "last.ckpt", weights_only=True)
    resumed = torch.load(tmp_path / "resumed" / "checkpoints" / "last.ckpt", weights_only=True)
    assert resumed["global_step"] == full["global_step"] == 2 * first_step
    for name, value in full["state_dict"].items():
        torch.testing.assert_close(resumed["state_dict"][name], value, msg=name)


def test_resume_mid_epoch_replays_the_same_batches(tmp_path: Path) -> None:
    # A checkpoint at step 10 of a 25-step epoch: the resumed run must skip the 10 batches it
    # already trained on and continue the dropout random stream, ending bit-identical.
    common = ["model.dropout=0.2", "trainer.max_epochs=2", "test_after_fit=false"]
    _fit(tmp_path / "full", *common)
    mid = ["trainer.max_steps=10", "callbacks.recent_checkpoints.every_n_train_steps=10"]
    _fit(tmp_path / "part", *common, *mid)
    part = tmp_path / "part" / "checkpoints" / "last.ckpt"
    assert torch.load(part, weights_only=True)["global_step"] == 10
    _fit(tmp_path / "resumed", *common, f"ckpt_path={part}")
    full = _weights(tmp_path / "full" / "checkpoints" / "last.ckpt")
    resumed = _weights(tmp_path / "resumed" / "checkpoints" / "last.ckpt")
    for name, value in full.items():
        torch.testing.assert_close(resumed[name], value, rtol=0, atol=0, msg=name)


def test_resume_mid_epoch_with_a_decaying_schedule(tmp_path: Path) -> None:
    # The linear schedule's horizon must be counted without building the training loader
    # early: Lightning then skips restoring the loader position and the resumed run replays
    # the epoch from its start. Resume from the full run's own step-10 checkpoint.
    common = [
        "model.dropout=0.2",
        "trainer.max_epochs=2",
        "test_after_fit=false",
        "module.lr_schedule=linear",
        "module.warmup_steps=5",
        "callbacks.recent_checkpoints.every_n_train_steps=10",
    ]
    _fit(tmp_path / "full", *common)
    (step10,) = (tmp_path / "full" / "checkpoints").glob("recent-*step000010.ckpt")
    _fit(tmp_path / "resumed", *common, f"ckpt_path={step10}")
    full = _weights(tmp_path / "full" / "checkpoints" / "last.ckpt")
    resumed = _weights(tmp_path / "resumed" / "checkpoints" / "last.ckpt")
    for name, value in full.items():
        torch.testing.assert_close(resumed[name], value, rtol=0, atol=0, msg=name)
