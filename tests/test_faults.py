"""Faults during training: kill -9, Ctrl-C, a diverging loss, and run-to-run determinism.

The subprocess tests run the real ``python train.py`` with tiny settings (tests/conftest.py
FAST_TRAIN) and a checkpoint every few optimizer steps.
"""

from __future__ import annotations

import csv
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from transformer_mt.cli import EXIT_INTERRUPTED, EXIT_RUNTIME_ERROR, exit_code_for, guarded
from transformer_mt.training.callbacks import (
    AtomicCheckpointIO,
    SafeModelCheckpoint,
    is_interrupt,
    weights_are_finite,
)
from transformer_mt.training.run import run

from conftest import FAST_TRAIN, compose_train

ROOT = Path(__file__).resolve().parents[1]
STEPS_PER_EPOCH = 25  # FAST_TRAIN: 300 pairs, max_tokens 512
EPOCHS = 8
#: Long enough (a few seconds) to be killed mid-run, a checkpoint every 3 optimizer steps.
LONG_RUN = [
    *FAST_TRAIN,
    f"trainer.max_epochs={EPOCHS}",
    "trainer.log_every_n_steps=1",
    "test_after_fit=false",
    "callbacks.recent_checkpoints.every_n_train_steps=3",
]


def start(run_dir: Path, *extra: str) -> subprocess.Popen[str]:
    """Start ``python train.py`` writing into ``run_dir``; stderr is captured."""
    env = {k: v for k, v in os.environ.items() if k not in ("HYDRA_FULL_ERROR",)}
    env.update(OMP_NUM_THREADS="1", HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1")
    return subprocess.Popen(
        [sys.executable, "train.py", f"hydra.run.dir={run_dir}", *LONG_RUN, *extra],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_for(path: Path, process: subprocess.Popen[str], timeout: float = 120) -> None:
    """Block until ``path`` exists (the first checkpoint), failing if training ends first."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        if process.poll() is not None:
            pytest.fail(f"training ended before {path} appeared: {process.stderr.read()[-2000:]}")
        if time.monotonic() > deadline:
            process.kill()
            pytest.fail(f"{path} did not appear within {timeout} s")
        time.sleep(0.05)


def load(path: Path) -> dict:
    """A checkpoint, loaded as a file from a stranger must be."""
    return torch.load(path, map_location="cpu", weights_only=True)


def kill_and_check(tmp_path: Path, delay: float) -> tuple[Path, int]:
    """Run, kill -9 ``delay`` s after the first checkpoint; last.ckpt must load. Its step."""
    run_dir = tmp_path / "killed"
    last = run_dir / "checkpoints" / "last.ckpt"
    process = start(run_dir)
    wait_for(last, process)
    time.sleep(delay)
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=60)
    assert process.returncode == -signal.SIGKILL
    checkpoint = load(last)  # never truncated: written to a temp file, then renamed
    assert 0 < checkpoint["global_step"] < EPOCHS * STEPS_PER_EPOCH, "killed too late"
    assert "state_dict" in checkpoint
    return last, int(checkpoint["global_step"])


def resume_and_finish(tmp_path: Path, ckpt: Path, killed_step: int) -> None:
    """Resume from ``ckpt`` in a new directory: it continues from its step and completes."""
    run_dir = tmp_path / "resumed"
    process = start(run_dir, f"ckpt_path={ckpt}")
    _, err = process.communicate(timeout=300)
    assert process.returncode == 0, err[-3000:]
    final = load(run_dir / "checkpoints" / "last.ckpt")
    assert final["global_step"] == EPOCHS * STEPS_PER_EPOCH
    with open(run_dir / "csv" / "metrics.csv") as handle:
        steps = [int(r["step"]) for r in csv.DictReader(handle) if r.get("train/loss")]
    assert min(steps) >= killed_step  # nothing before the checkpoint was trained again


def test_kill_9_leaves_a_loadable_checkpoint(tmp_path: Path) -> None:
    kill_and_check(tmp_path, delay=random.uniform(0.0, 1.5))


@pytest.mark.slow
@pytest.mark.parametrize("attempt", range(5))
def test_kill_9_at_a_random_step_then_resume_completes(tmp_path: Path, attempt: int) -> None:
    last, step = kill_and_check(tmp_path, delay=random.Random(attempt).uniform(0.0, 2.0))
    resume_and_finish(tmp_path, last, step)


def interrupt(tmp_path: Path) -> tuple[Path, int, str]:
    """Send SIGINT after the first checkpoint; exit 130 with one line naming last.ckpt."""
    run_dir = tmp_path / "interrupted"
    last = run_dir / "checkpoints" / "last.ckpt"
    process = start(run_dir)
    wait_for(last, process)
    time.sleep(0.5)
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=120)
    assert process.returncode == EXIT_INTERRUPTED, err[-5000:]
    assert "Traceback" not in err
    (line,) = [x for x in err.splitlines() if x.startswith("error:")]
    assert "training interrupted at step" in line
    assert f"resumable checkpoint saved: {last}" in line
    assert f"ckpt_path={last}" in line
    checkpoint = load(last)
    step = int(line.split("at step ")[1].split(";")[0])
    assert checkpoint["global_step"] == step  # saved at the step reached, not an older one
    return last, step, line


def test_ctrl_c_saves_a_resumable_checkpoint(tmp_path: Path) -> None:
    interrupt(tmp_path)


@pytest.mark.slow
def test_ctrl_c_then_resume_completes(tmp_path: Path) -> None:
    last, step, _ = interrupt(tmp_path)
    resume_and_finish(tmp_path, last, step)


# ------------------------------------------------------------------------- non-finite loss


def test_diverging_loss_stops_with_one_line_and_keeps_finite_checkpoint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = compose_train(
        tmp_path,
        [
            *FAST_TRAIN,
            "optimizer.lr=1e30",
            "trainer.gradient_clip_val=null",
            "callbacks.recent_checkpoints.every_n_train_steps=1",
        ],
    )
    with pytest.raises(SystemExit) as exited:
        guarded(run)(cfg)
    assert exited.value.code == EXIT_RUNTIME_ERROR
    (line,) = [x for x in capsys.readouterr().err.splitlines() if x.startswith("error:")]
    assert "training loss became" in line and "at step" in line and "lower optimizer.lr" in line
    last = tmp_path / "checkpoints" / "last.ckpt"
    if last.exists():
        assert f"last good checkpoint: {last}" in line
        state = load(last)["state_dict"]
        assert all(torch.isfinite(t).all() for t in state.values() if t.is_floating_point())
    else:
        assert "no checkpoint was written" in line


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
