"""Faults during training: kill -9, Ctrl-C, SIGTERM, a full disk, a diverging loss, determinism.

Every fault is sent at a known training step by the test-only callback
:class:`~faults.FaultInjection` (``+callbacks.fault=...``): the
process signals itself, or fills its disk, once N optimizer steps are done. No test waits for
a file and then sleeps before signalling, so a slow or a fast machine cannot change the outcome.
The subprocess tests run the real ``python train.py`` with tiny settings (tests/conftest.py
FAST_TRAIN) and a checkpoint every 3 optimizer steps.
"""

from __future__ import annotations

import csv
import random
import signal
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from transformer_mt.errors import (
    EXIT_INTERRUPTED,
    EXIT_RUNTIME_ERROR,
    EXIT_USER_ERROR,
    exit_code_for,
    guarded,
)
from transformer_mt.training.callbacks import (
    AtomicCheckpointIO,
    SafeModelCheckpoint,
    is_interrupt,
    weights_are_finite,
)
from transformer_mt.training.run import run

from conftest import FAST_TRAIN, compose_train, error_line, mounted_tmpfs, train_py
from faults import FaultInjection

STEPS_PER_EPOCH = 25  # FAST_TRAIN: 300 pairs, max_tokens 512
EPOCHS = 8
SAVE_EVERY = 3
#: A checkpoint every 3 optimizer steps; 8 epochs, so a fault always lands mid-run.
LONG_RUN = [
    *FAST_TRAIN,
    f"trainer.max_epochs={EPOCHS}",
    "trainer.log_every_n_steps=1",
    "test_after_fit=false",
    f"callbacks.recent_checkpoints.every_n_train_steps={SAVE_EVERY}",
]
FAULT = "faults.FaultInjection"


def fault(kind: str, at_step: int, phase: str = "batch_start") -> list[str]:
    """Overrides that make the run inject ``kind`` once ``at_step`` optimizer steps are done."""
    return [
        f"+callbacks.fault._target_={FAULT}",
        f"+callbacks.fault.fault={kind}",
        f"+callbacks.fault.at_step={at_step}",
        f"+callbacks.fault.phase={phase}",
    ]


def load(path: Path) -> dict:
    """A checkpoint, loaded as a file from a stranger must be."""
    return torch.load(path, map_location="cpu", weights_only=True)


def kill_and_check(tmp_path: Path, step: int) -> tuple[Path, int]:
    """kill -9 once ``step`` steps are done; last.ckpt holds the newest save, intact."""
    run_dir = tmp_path / "killed"
    last = run_dir / "checkpoints" / "last.ckpt"
    done = train_py([*LONG_RUN, *fault("SIGKILL", step)], run_dir)
    assert done.returncode == -signal.SIGKILL, done.stderr[-3000:]
    checkpoint = load(last)  # never truncated: written to a temp file, then renamed
    assert checkpoint["global_step"] == step - step % SAVE_EVERY
    assert "state_dict" in checkpoint
    leftovers = [p.name for p in last.parent.iterdir() if p.name.endswith(".tmp")]
    assert leftovers == []
    return last, int(checkpoint["global_step"])


def resume_and_finish(tmp_path: Path, ckpt: Path, killed_step: int) -> None:
    """Resume from ``ckpt`` in a new directory: it continues from its step and completes."""
    run_dir = tmp_path / "resumed"
    done = train_py([*LONG_RUN, f"ckpt_path={ckpt}"], run_dir)
    assert done.returncode == 0, done.stderr[-3000:]
    final = load(run_dir / "checkpoints" / "last.ckpt")
    assert final["global_step"] == EPOCHS * STEPS_PER_EPOCH
    with open(run_dir / "csv" / "metrics.csv") as handle:
        steps = [int(r["step"]) for r in csv.DictReader(handle) if r.get("train/loss")]
    assert min(steps) >= killed_step  # nothing before the checkpoint was trained again


def test_kill_9_leaves_a_loadable_checkpoint(tmp_path: Path) -> None:
    kill_and_check(tmp_path, step=random.Random(12).randrange(4, 3 * STEPS_PER_EPOCH))


@pytest.mark.slow
@pytest.mark.parametrize("attempt", range(5))
def test_kill_9_at_a_seeded_step_then_resume_completes(tmp_path: Path, attempt: int) -> None:
    step = random.Random(attempt).randrange(1, 3 * STEPS_PER_EPOCH)
    last, saved = kill_and_check(tmp_path, step)
    resume_and_finish(tmp_path, last, saved)


def interrupt(tmp_path: Path, kind: str = "SIGINT", at_step: int = 7) -> tuple[Path, int, str]:
    """``kind`` arrives between backward and the optimizer step of step ``at_step + 1``.

    The run finishes that step, saves a checkpoint of it and exits 130 with one line.
    """
    run_dir = tmp_path / "interrupted"
    last = run_dir / "checkpoints" / "last.ckpt"
    done = train_py([*LONG_RUN, *fault(kind, at_step, "before_optimizer_step")], run_dir)
    assert done.returncode == EXIT_INTERRUPTED, done.stderr[-5000:]
    line = error_line(done.stderr)
    stopped = at_step + 1  # the step in flight completes
    assert f"training interrupted at step {stopped};" in line
    assert f"resumable checkpoint saved: {last}" in line
    assert f"ckpt_path={last}" in line
    assert load(last)["global_step"] == stopped  # saved at the step reached, not an older one
    return last, stopped, line


def test_ctrl_c_saves_a_resumable_checkpoint(tmp_path: Path) -> None:
    interrupt(tmp_path, "SIGINT")


@pytest.mark.slow  # the signal path is Ctrl-C's, held by the test above
def test_sigterm_saves_a_resumable_checkpoint(tmp_path: Path) -> None:
    interrupt(tmp_path, "SIGTERM", at_step=11)


@pytest.mark.slow
def test_ctrl_c_then_resume_completes(tmp_path: Path) -> None:
    last, step, _ = interrupt(tmp_path)
    resume_and_finish(tmp_path, last, step)


def test_fault_injection_rejects_unknown_faults() -> None:
    with pytest.raises(ValueError, match="SIGINT, SIGTERM, SIGKILL or fill_disk"):
        FaultInjection("SIGHUP", 3)
    with pytest.raises(ValueError, match="batch_start or before_optimizer_step"):
        FaultInjection("SIGINT", 3, phase="later")


# ------------------------------------------------------------------------------ full disk


@pytest.fixture
def small_disk(tmp_path: Path):
    """A 24 MiB tmpfs (needs root and mount): a real file system that can fill up."""
    with mounted_tmpfs(tmp_path / "disk", "24m") as mount:
        yield mount


def test_disk_full_mid_run_is_one_line_and_keeps_the_last_checkpoint(small_disk: Path) -> None:
    run_dir = small_disk / "run"
    done = train_py([*LONG_RUN, *fault("fill_disk", 7)], run_dir)
    line = error_line(done.stderr)
    assert done.returncode == EXIT_USER_ERROR, done.stderr[-3000:]
    assert "No space left on device" in line and "free some disk space" in line
    last = run_dir / "checkpoints" / "last.ckpt"
    assert f"ckpt_path={last}" in line
    assert load(last)["global_step"] == 6  # the save before the disk filled up, intact
    debris = [p.name for p in (run_dir / "checkpoints").iterdir() if p.name.endswith(".tmp")]
    assert debris == []


# ------------------------------------------------------------------------- non-finite loss


def diverging_run(tmp_path: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> str:
    """A run whose loss diverges at once (lr 1e30, no clipping): it exits 1; its error line."""
    overrides = [*FAST_TRAIN, "optimizer.lr=1e30", "trainer.gradient_clip_val=null", *extra]
    with pytest.raises(SystemExit) as exited:
        guarded(run)(compose_train(tmp_path, overrides))
    assert exited.value.code == EXIT_RUNTIME_ERROR
    return error_line(capsys.readouterr().err)


def test_diverging_loss_stops_with_one_line_and_keeps_finite_checkpoint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    line = diverging_run(tmp_path, capsys, "callbacks.recent_checkpoints.every_n_train_steps=1")
    assert "training loss became" in line and "at step" in line and "lower optimizer.lr" in line
    last = tmp_path / "checkpoints" / "last.ckpt"
    if last.exists():
        assert f"last good checkpoint: {last}" in line
        state = load(last)["state_dict"]
        assert all(torch.isfinite(t).all() for t in state.values() if t.is_floating_point())
    else:
        assert "no checkpoint was written" in line


def test_skipping_non_finite_losses_stops_once_the_weights_are_nan(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    line = diverging_run(tmp_path, capsys, "module.nonfinite_loss=skip", "module.warmup_steps=1")
    assert "so module.nonfinite_loss=skip cannot recover" in line and "lower optimizer.lr" in line
    assert "the weights themselves are NaN/inf" in line or "10 batches in a row" in line


def test_checkpoint_callback_refuses_non_finite_weights(tmp_path: Path) -> None:
    module = torch.nn.Linear(2, 2)
    saved: list[str] = []
    trainer = SimpleNamespace(
        lightning_module=module,
        global_step=7,
        save_checkpoint=lambda path, weights_only=False: saved.append(path),
        is_global_zero=True,
        loggers=[],
    )
    callback = SafeModelCheckpoint(dirpath=tmp_path)
    callback._save_checkpoint(trainer, str(tmp_path / "ok.ckpt"))
    with torch.no_grad():
        module.weight[0, 0] = float("nan")
    assert not weights_are_finite(module)
    callback._save_checkpoint(trainer, str(tmp_path / "nan.ckpt"))
    assert saved == [str(tmp_path / "ok.ckpt")]


def test_only_interruptions_save_on_exception(tmp_path: Path) -> None:
    calls: list[str] = []

    class Probe(SafeModelCheckpoint):
        def _should_save_on_exception(self, trainer: object) -> bool:
            calls.append("asked")
            return False

    probe = Probe(dirpath=tmp_path)
    probe.on_exception(None, None, RuntimeError("nan"))  # type: ignore[arg-type]
    assert calls == []
    probe.on_exception(None, None, KeyboardInterrupt())  # type: ignore[arg-type]
    assert calls == ["asked"]


def test_ctrl_c_masked_by_cleanup_code_is_still_an_interrupt() -> None:
    # torch.save interrupted mid-write: its zip writer's cleanup raises a RuntimeError.
    try:
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt:
            raise RuntimeError("PytorchStreamWriter failed writing central directory")  # noqa: B904
    except RuntimeError as masked:
        assert is_interrupt(masked)
        assert exit_code_for(masked) == EXIT_INTERRUPTED
    assert not is_interrupt(RuntimeError("a bug"))


# --------------------------------------------------------------------------- atomic saves


def test_atomic_save_keeps_the_old_file_when_interrupted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    io = AtomicCheckpointIO()
    target = tmp_path / "last.ckpt"
    io.save_checkpoint({"global_step": 1}, target)

    def dies_halfway(obj: object, handle: object) -> None:
        handle.write(b"partial")  # type: ignore[attr-defined]
        raise KeyboardInterrupt

    monkeypatch.setattr(torch, "save", dies_halfway)
    with pytest.raises(KeyboardInterrupt):
        io.save_checkpoint({"global_step": 2}, target)
    monkeypatch.undo()
    assert load(target)["global_step"] == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]  # no temp left behind
    io.save_checkpoint({"global_step": 3}, target)
    assert load(target)["global_step"] == 3


# ---------------------------------------------------------------------------- determinism


def _train_loss_curve(run_dir: Path) -> list[str]:
    with open(run_dir / "csv" / "metrics.csv") as handle:
        return [r["train/loss"] for r in csv.DictReader(handle) if r.get("train/loss")]


def test_same_seed_same_loss_curve_and_weights(tmp_path: Path) -> None:
    overrides = [
        *FAST_TRAIN,
        "trainer.log_every_n_steps=1",
        "test_after_fit=false",
        "model.dropout=0.1",  # the random stream must repeat too
    ]
    for name in ("a", "b"):
        run(compose_train(tmp_path / name, overrides))
    curve_a, curve_b = _train_loss_curve(tmp_path / "a"), _train_loss_curve(tmp_path / "b")
    assert len(curve_a) == STEPS_PER_EPOCH
    assert curve_a == curve_b  # the logged strings: bitwise-equal floats
    state_a = load(tmp_path / "a" / "checkpoints" / "last.ckpt")["state_dict"]
    state_b = load(tmp_path / "b" / "checkpoints" / "last.ckpt")["state_dict"]
    assert state_a.keys() == state_b.keys()
    for name, tensor in state_a.items():
        assert torch.equal(tensor, state_b[name]), name
