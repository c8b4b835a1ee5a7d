"""Resuming is bit-identical on CPU: from any regular checkpoint and from a Ctrl-C/SIGTERM one;
a checkpoint of another tokenizer or model is refused with one line.

One uninterrupted reference run (2 epochs of 25 steps, dropout on, a checkpoint every 5 steps,
data loader workers on) is compared with runs resumed from its checkpoints in epoch 0, at the
end of epoch 0 and in epoch 1, and with runs stopped by a signal at a known step (test-only
FaultInjection callback) and then resumed: the final weights must be equal, ``atol=0``.

Runs use step/epoch budgets; a run with a wall-clock budget (``trainer.max_time``) cannot be
bit-identical by nature (docs/training.md).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from transformer_mt.data.batching import TokenBudgetBatchSampler
from transformer_mt.errors import EXIT_INTERRUPTED, EXIT_USER_ERROR, guarded
from transformer_mt.training.run import run

from conftest import FAST_TRAIN, FILES_TRAIN, compose_train, error_line, short_run, write_corpus

STEPS_PER_EPOCH = 25
RESUME_RUN = [
    *FAST_TRAIN,
    "trainer.max_epochs=2",
    "trainer.log_every_n_steps=1",
    "test_after_fit=false",
    "model.dropout=0.1",  # the random stream must continue exactly
    # Workers: the loader then draws its first batches before Lightning sets the epoch,
    # which is what made mid-epoch resumes in epoch >= 1 replay epoch 0's order.
    "data.num_workers=2",
    "callbacks.recent_checkpoints.every_n_train_steps=5",
    "callbacks.recent_checkpoints.save_top_k=-1",
]
FAULT = "faults.FaultInjection"


def weights(run_dir: Path) -> dict[str, torch.Tensor]:
    checkpoint = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)
    assert checkpoint["global_step"] == 2 * STEPS_PER_EPOCH
    return checkpoint["state_dict"]


def assert_same_weights(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert got.keys() == want.keys()
    for name, value in want.items():
        torch.testing.assert_close(got[name], value, rtol=0, atol=0, msg=name)


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The uninterrupted run; its checkpoints are the resume points."""
    run_dir = tmp_path_factory.mktemp("reference")
    run(compose_train(run_dir, RESUME_RUN))
    return run_dir


def resumed_from(tmp_path: Path, ckpt: Path) -> dict[str, torch.Tensor]:
    run(compose_train(tmp_path / "resumed", [*RESUME_RUN, f"ckpt_path={ckpt}"]))
    return weights(tmp_path / "resumed")


@pytest.mark.slow
@pytest.mark.parametrize("step", [10, 25, 35], ids=["mid-epoch-0", "end-of-epoch-0", "mid-epoch-1"])
def test_resume_from_a_regular_checkpoint_is_bit_identical(
    reference: Path, tmp_path: Path, step: int
) -> None:
    (ckpt,) = (reference / "checkpoints").glob(f"recent-*-step{step:06d}.ckpt")
    assert_same_weights(resumed_from(tmp_path, ckpt), weights(reference))


@pytest.mark.slow
@pytest.mark.parametrize(
    ("kind", "at_step"), [("SIGINT", 32), ("SIGTERM", 13)], ids=["ctrl-c-epoch-1", "sigterm"]
)
def test_resume_after_a_signal_is_bit_identical(
    reference: Path, tmp_path: Path, kind: str, at_step: int
) -> None:
    # The signal arrives between backward and the optimizer step: the middle of a step.
    interrupted = tmp_path / "interrupted"
    overrides = [
        *RESUME_RUN,
        f"+callbacks.fault._target_={FAULT}",
        f"+callbacks.fault.fault={kind}",
        f"+callbacks.fault.at_step={at_step}",
        "+callbacks.fault.phase=before_optimizer_step",
    ]
    with pytest.raises(SystemExit) as exited:
        guarded(run)(compose_train(interrupted, overrides))
    assert exited.value.code == EXIT_INTERRUPTED
    last = interrupted / "checkpoints" / "last.ckpt"
    assert torch.load(last, weights_only=True)["global_step"] == at_step + 1
    assert_same_weights(resumed_from(tmp_path, last), weights(reference))


# ------------------------------------------------------------------- the sampler on its own


def lightning_order(sampler: TokenBudgetBatchSampler, state: dict[str, int], epoch: int) -> list:
    """What Lightning does on resume: load the state, start iterating, *then* set the epoch.

    A DataLoader with workers fetches its first batches as soon as the iterator exists, so
    the sampler is advanced before ``set_epoch`` is called.
    """
    sampler.resume(state["epoch"], state["consumed"])
    iterator = iter(sampler)
    first = next(iterator, None)
    sampler.set_epoch(epoch)
    rest = list(iterator)
    return ([first] if first is not None else []) + rest


def make_sampler() -> TokenBudgetBatchSampler:
    lengths = np.random.default_rng(0).integers(3, 30, size=200)
    return TokenBudgetBatchSampler(lengths, lengths, max_tokens=120, seed=7)


def test_sampler_resumes_mid_epoch_1_before_set_epoch() -> None:
    uninterrupted = [b.tolist() for b in make_sampler().batches(1)]
    resumed = lightning_order(make_sampler(), {"epoch": 1, "consumed": 4}, epoch=1)
    assert resumed == uninterrupted[4:]


def test_sampler_resumed_at_the_end_of_an_epoch_starts_the_next() -> None:
    sampler = make_sampler()
    epoch_1 = [b.tolist() for b in sampler.batches(1)]
    resumed = lightning_order(make_sampler(), {"epoch": 0, "consumed": len(sampler)}, epoch=1)
    assert resumed == epoch_1


def test_sampler_resume_applies_to_one_iteration_only() -> None:
    sampler = make_sampler()
    sampler.resume(0, 3)
    assert len(list(sampler)) == len(sampler) - 3
    sampler.set_epoch(1)
    assert [b for b in sampler] == [b.tolist() for b in sampler.batches(1)]


@pytest.mark.parametrize("change", ["vocab_size", "same_size", "model_shape"])
def test_resume_with_another_tokenizer_or_model_is_refused(
    tmp_path: Path, change: str, capsys: pytest.CaptureFixture[str]
) -> None:
    ckpt = short_run(tmp_path / "first", write_corpus(tmp_path / "a"), "test_after_fit=false")
    if change == "vocab_size":
        overrides = [f"data.dir={tmp_path / 'a'}", "data.vocab_size=280"]
        expected = (
            "another tokenizer than this run's (vocabulary 300/300 (src/tgt) vs this run's 280/280"
        )
    elif change == "same_size":  # other text, same vocabulary size: ids mean other subwords
        other = tmp_path / "b"
        other.mkdir()
        for prefix in ("train", "val", "test"):
            for lang in ("en", "de"):
                lines = [f"the quick brown fox {i} jumps over lazy dogs\n" for i in range(30)]
                (other / f"{prefix}.{lang}").write_text("".join(lines))
        overrides = [f"data.dir={other}"]
        expected = "another tokenizer than this run's (the same size (300) but different subwords"
    else:
        overrides = [f"data.dir={tmp_path / 'a'}", "model.d_ff=48"]
        expected = "it holds a different model, model.d_ff=64 (this run: 48)"
    cfg = compose_train(tmp_path / "resumed", [*FILES_TRAIN, *overrides, f"ckpt_path={ckpt}"])
    with pytest.raises(SystemExit) as exited:
        guarded(run)(cfg)
    assert exited.value.code == EXIT_USER_ERROR
    line = error_line(capsys.readouterr().err)
    assert f"cannot resume from {ckpt}: " in line
    assert expected in line


# ------------------------------------------------------------------- metrics of every part


def csv_rows(run_dir: Path) -> list[dict[str, str]]:
    import csv

    with open(run_dir / "csv" / "metrics.csv", newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def logged(rows: list[dict[str, str]], key: str) -> list[int]:
    return [int(row["step"]) for row in rows if row.get(key)]


@pytest.mark.slow
def test_resuming_into_the_same_directory_keeps_every_metric(tmp_path: Path) -> None:
    """Interrupt at step 30 (in epoch 1, after epoch 0's validation), resume into the same
    run directory: metrics.csv holds each logged step of both parts exactly once."""
    overrides = [*FAST_TRAIN, "trainer.max_epochs=2", "trainer.log_every_n_steps=1"]
    overrides += ["test_after_fit=false"]
    run_dir = tmp_path / "run"
    fault = [
        f"+callbacks.fault._target_={FAULT}",
        "+callbacks.fault.fault=SIGINT",
        "+callbacks.fault.at_step=30",
    ]
    with pytest.raises(SystemExit) as exited:
        guarded(run)(compose_train(run_dir, [*overrides, *fault]))
    assert exited.value.code == EXIT_INTERRUPTED
    last = run_dir / "checkpoints" / "last.ckpt"
    stopped = torch.load(last, weights_only=True)["global_step"]  # the step in flight finished
    first = csv_rows(run_dir)
    assert logged(first, "train/loss") == list(range(stopped))  # the last step's logs too
    assert len(logged(first, "val/loss")) == 1  # the validation of epoch 0

    run(compose_train(run_dir, [*overrides, f"ckpt_path={last}"]))
    total = torch.load(last, weights_only=True)["global_step"]
    both = csv_rows(run_dir)
    kept = [{key: row[key] for key in first[0]} for row in both[: len(first)]]
    assert kept == first  # the first part's rows, unchanged and first
    assert logged(both, "train/loss") == list(range(total))  # every step once, in order
    assert len(logged(both, "val/loss")) == 2  # epoch 0's (first part) and epoch 1's
