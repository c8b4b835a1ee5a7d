"""The run directory: found unusable at start-up (before any data work), locked by one run.

A full disk, an unwritable or read-only directory and too little room for the checkpoints are
reported as one ``error:`` line before the data is prepared; a second run into a busy run
directory is refused with the holder's PID, and a lock left by a killed run is taken over.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from transformer_mt.errors import EXIT_USER_ERROR, UserError, guarded
from transformer_mt.training.run import run
from transformer_mt.training.rundir import check_not_another_run, check_output_dir

from conftest import (
    FILES_TRAIN,
    compose_train,
    error_line,
    mounted_tmpfs,
    regular_file,
    short_run,
    train_py,
    write_corpus,
)


def test_full_disk_is_reported_at_start(tmp_path: Path) -> None:
    """A 256 KiB tmpfs cannot take check_output_dir's 1 MiB probe (needs root + mount)."""
    with mounted_tmpfs(tmp_path / "small", "256k") as mount:
        with pytest.raises(OSError, match="No space left on device; free some disk space"):
            check_output_dir(mount / "run")
        assert list((mount / "run").iterdir()) == []  # the probe file is removed as well


def test_unwritable_hydra_run_dir_is_one_line(tmp_path: Path) -> None:
    """Hydra creates hydra.run.dir before the task runs: RunDirGuard answers for it."""
    target = regular_file(tmp_path)
    result = train_py([*FILES_TRAIN, "data.dir=x"], target / "run")
    assert result.returncode == EXIT_USER_ERROR, result.stderr[-3000:]
    line = error_line(result.stderr)
    assert f"cannot write to the run directory {target}/run: Not a directory" in line
    assert "hydra.run.dir=PATH" in line


def _another_run(run_dir: Path) -> dict[str, bytes]:
    """A finished run's files (what Hydra and the checkpoint callback leave), by path."""
    files = {
        ".hydra/config.yaml": b"model: {}\n",
        ".hydra/hydra.yaml": b"hydra: {}\n",
        ".hydra/overrides.yaml": b"[]\n",
        "train.log": b"[info] a line of the other run\n",
        "checkpoints/last.ckpt": b"not read",
    }
    for name, data in files.items():
        (run_dir / name).parent.mkdir(parents=True, exist_ok=True)
        (run_dir / name).write_bytes(data)
    return files


def test_a_run_dir_of_another_run_is_refused_before_hydra_writes_into_it(tmp_path: Path) -> None:
    other = tmp_path / "other"
    files = _another_run(other)
    mine = tmp_path / "mine.ckpt"
    mine.write_bytes(b"a checkpoint of another run")
    result = train_py([*FILES_TRAIN, "data.dir=x", f"ckpt_path={mine}"], other)
    assert result.returncode == EXIT_USER_ERROR, result.stderr[-3000:]
    line = error_line(result.stderr)
    assert f"hydra.run.dir={other} holds the checkpoints of another run" in line
    assert f"ckpt_path={other}/checkpoints/last.ckpt" in line
    found = {str(p.relative_to(other)) for p in other.rglob("*") if p.is_file()}
    assert found == set(files)
    assert all((other / name).read_bytes() == data for name, data in files.items())


def test_a_run_dir_is_taken_when_empty_or_when_resuming_its_own_run(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    check_not_another_run(run_dir, None)  # not there yet
    (run_dir / "checkpoints").mkdir(parents=True)
    check_not_another_run(run_dir, None)  # a run that saved nothing
    _another_run(run_dir)
    for own in (run_dir / "checkpoints" / "last.ckpt", "last"):
        check_not_another_run(run_dir, own)
    for stranger in (None, tmp_path / "elsewhere.ckpt"):
        with pytest.raises(UserError, match="holds the checkpoints of another run"):
            check_not_another_run(run_dir, stranger)


@pytest.fixture
def read_only_checkpoints(tmp_path: Path):
    """``run/checkpoints`` that nothing can write into, even root (a read-only bind mount)."""
    path = tmp_path / "run" / "checkpoints"
    path.mkdir(parents=True)
    if os.geteuid() != 0:
        path.chmod(0o555)
        yield path
        path.chmod(0o755)
        return
    done = subprocess.run(["mount", "--bind", str(path), str(path)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot bind-mount: {done.stderr.decode().strip()}")
    try:
        subprocess.run(["mount", "-o", "remount,ro,bind", str(path)], check=True)
        yield path
    finally:
        subprocess.run(["umount", str(path)], check=False)


def test_read_only_checkpoint_dir_is_found_at_start(
    tmp_path: Path, read_only_checkpoints: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = read_only_checkpoints.parent
    cfg = compose_train(run_dir, [*FILES_TRAIN, f"data.dir={write_corpus(tmp_path / 'corpus')}"])
    with pytest.raises(SystemExit) as exited:
        guarded(run)(cfg)
    assert exited.value.code == EXIT_USER_ERROR
    line = error_line(capsys.readouterr().err)
    assert f"cannot write to the checkpoint directory {read_only_checkpoints}" in line
    assert not (run_dir / "tokenizer.json").exists()  # found before the data was prepared
    assert not list(read_only_checkpoints.iterdir())


@pytest.fixture
def tiny_disk(tmp_path: Path):
    """A 2 MiB tmpfs (root + mount): room for the start-up probe, not for 10 checkpoints."""
    with mounted_tmpfs(tmp_path / "tiny_disk", "2m") as mount:
        yield mount


def test_no_room_for_the_checkpoints_is_found_at_start(
    tmp_path: Path, tiny_disk: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    overrides = [*FILES_TRAIN, f"data.dir={write_corpus(tmp_path / 'corpus')}"]
    with pytest.raises(SystemExit) as exited:
        guarded(run)(compose_train(tiny_disk / "run", overrides))
    assert exited.value.code == EXIT_USER_ERROR
    line = error_line(capsys.readouterr().err)
    assert "not enough disk space for the checkpoints of this run" in line
    assert "save_top_k" in line
    assert not (tiny_disk / "run" / "checkpoints").exists()


def _lock_holder(run_dir: Path) -> subprocess.Popen[str]:
    """Another process holding ``run_dir``; it waits on stdin, so the test decides when it ends."""
    code = (
        "import sys; from pathlib import Path; "
        "from transformer_mt.training.rundir import lock_run_dir; "
        f"lock_run_dir(Path({str(run_dir)!r})); print('locked', flush=True); sys.stdin.read()"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", code],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
    return holder


def test_second_run_into_a_busy_run_dir_is_refused_with_the_holders_pid(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    holder = _lock_holder(run_dir)
    try:
        cfg = compose_train(run_dir, [*FILES_TRAIN, f"data.dir={write_corpus(tmp_path / 'c')}"])
        with pytest.raises(SystemExit) as exited:
            guarded(run)(cfg)
    finally:
        holder.communicate("")
    assert exited.value.code == EXIT_USER_ERROR
    line = error_line(capsys.readouterr().err)
    assert (
        f"the run directory {run_dir} is in use by another training run (PID {holder.pid}" in line
    )
    assert not (run_dir / "tokenizer.json").exists()  # nothing of the holder's was touched


def test_lock_of_a_killed_run_is_recovered_and_summary_names_own_checkpoints(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = tmp_path / "run"
    corpus = write_corpus(tmp_path / "c")
    short_run(run_dir, corpus, "test_after_fit=false")  # an earlier run left last.ckpt here
    holder = _lock_holder(run_dir)
    holder.send_signal(signal.SIGKILL)  # dies holding the lock
    holder.wait()
    capsys.readouterr()
    first = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)["global_step"]
    ckpt = short_run(run_dir, corpus, "test_after_fit=false", "trainer.max_epochs=2")
    out = capsys.readouterr().out
    own = run_dir / "checkpoints" / "last-v1.ckpt"  # Lightning does not overwrite last.ckpt
    assert own.is_file() and ckpt.is_file()
    assert torch.load(own, weights_only=True)["global_step"] == 2 * first
    flat = "".join(ch for ch in out if not ch.isspace() and ch not in "│┃|")
    assert f"lastcheckpoint{own}" in flat  # this run's file, not the earlier run's last.ckpt
