"""The bad-input catalogue (docs/errors.md): every user mistake is one `error:` line, no traceback.

Each case runs ``train.py``'s guarded pipeline in-process (fast) and, marked slow, as a real
``python train.py`` subprocess; Hydra's own composition errors always run as a subprocess.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from transformer_mt.cli import (
    DEBUG_VARIABLES,
    EXIT_INTERRUPTED,
    EXIT_RUNTIME_ERROR,
    EXIT_USER_ERROR,
    NonFiniteLossError,
    TrainingInterrupted,
    UserError,
    exit_code_for,
    guarded,
    one_line,
)
from transformer_mt.training.run import check_output_dir, run

from conftest import FAST_TRAIN, ROOT, compose_train, mounted_tmpfs

#: FAST_TRAIN without the keys that exist only in the generated (numbers) data config.
BASE_TRAIN = [o for o in FAST_TRAIN if not o.startswith("data.")]
FILES_TRAIN = [
    *BASE_TRAIN,
    "data=files",
    "data.vocab_size=300",
    "data.max_tokens=512",
    "data.eval_max_tokens=512",
    "data.max_len=64",
    "data.num_workers=0",
    "data.cache_dir=null",
]


def write_corpus(directory: Path, lines: int = 30, **overrides: bytes) -> Path:
    """A tiny parallel corpus {train,val,test}.{en,de}; ``overrides`` replaces whole files."""
    directory.mkdir(parents=True, exist_ok=True)
    for prefix in ("train", "val", "test"):
        for lang in ("en", "de"):
            text = "".join(f"{lang} sentence {i} of {prefix}\n" for i in range(lines))
            (directory / f"{prefix}.{lang}").write_bytes(text.encode())
    for name, content in overrides.items():
        (directory / name.replace("_", ".")).write_bytes(content)
    return directory


def _corpus(tmp: Path, **files: bytes) -> list[str]:
    return [f"data.dir={write_corpus(tmp / 'corpus', **files)}"]


# case id -> (overrides given tmp_path, text the error line must contain, env)
CASES = {
    "missing_dir": (
        lambda t: ["data.dir=/nope"],
        ["Corpus directory not found: /nope", "data.dir"],
    ),
    "missing_file": (
        lambda t: [f"data.dir={_drop(write_corpus(t / 'corpus'), 'val.de')}"],
        ["Corpus file not found", "val.de", "data.prefixes"],
    ),
    "line_counts_differ": (
        lambda t: _corpus(t, train_de=b"only one line\n"),
        ["Line counts differ", "has 30 lines", "has 1", "line-aligned"],
    ),
    "empty_split": (
        lambda t: _corpus(t, test_en=b"", test_de=b""),
        ["Split 'test' is empty"],
    ),
    "undecodable_bytes": (
        lambda t: _corpus(t, train_en=b"fine\nalso fine\nbad \xff byte\n" * 10),
        ["train.en, line 3: not valid UTF-8", "iconv"],
    ),
    "all_pairs_too_long": (
        lambda t: [*_corpus(t), "data.max_len=2"],
        ["All 30 training pairs were filtered out", "max_len=2", "raise data.max_len"],
    ),
    "hub_unreachable": (
        lambda t: [*BASE_TRAIN, "data=multi30k", "data.num_workers=0", "data.cache_dir=null"],
        ["Cannot load 'bentrevett/multi30k'", "data.source=files data.dir="],
    ),
    "d_model_not_divisible": (
        lambda t: [*_corpus(t), "model.d_model=30", "model.n_heads=4"],
        ["model.d_model=30 is not divisible by model.n_heads=4"],
    ),
    "negative_dropout": (
        lambda t: [*_corpus(t), "model.dropout=-0.1"],
        ["model.dropout must be in [0, 1), got -0.1"],
    ),
    "dropout_one": (
        lambda t: [*_corpus(t), "model.dropout=1.0"],
        ["model.dropout must be in [0, 1), got 1.0"],
    ),
    "max_tokens_too_small": (
        lambda t: [*_corpus(t), "data.max_tokens=10"],
        ["max_tokens=10 cannot hold one sentence of max_len=64", "raise data.max_tokens"],
    ),
    "beam_size_zero": (
        lambda t: [*_corpus(t), "module.decoding.beam_size=0"],
        ["beam_size must be >= 1, got 0"],
    ),
    "missing_data_dir_value": (
        lambda t: [],
        ["missing required config value(s): data.dir", "data.dir=..."],
    ),
    "unwritable_run_dir": (
        lambda t: [*_corpus(t), f"run_dir={_regular_file(t)}/run"],
        ["cannot write to the run directory", "Not a directory", "run_dir=PATH"],
    ),
    "max_len_beyond_positional_table": (
        lambda t: [*_corpus(t), "model.max_len=64"],  # FILES_TRAIN: data.max_len=64
        ["data.max_len=64 does not fit model.max_len=64", "data.max_len=63", "model.max_len=65"],
    ),
    "d_model_not_a_number": (
        lambda t: [*_corpus(t), "model.d_model=abc"],
        ["model.d_model must be an integer, got 'abc' (str)", "model.d_model=512"],
    ),
    "truncated_gz": (
        lambda t: [f"data.dir={_truncated_gz(write_corpus(t / 'corpus'), 'train.de')}"],
        ["train.de.gz: cannot read it after line", "truncated or corrupt", "gzip -t"],
    ),
    "ckpt_truncated": (
        lambda t: [*_corpus(t), f"ckpt_path={_truncated_checkpoint(t)}"],
        ["is truncated or corrupted", "use another checkpoint"],
    ),
    "ckpt_foreign": (
        lambda t: [*_corpus(t), f"ckpt_path={_foreign_checkpoint(t)}"],
        ["not from transformer-mt", "use a checkpoint written by train.py"],
    ),
    "ckpt_not_a_checkpoint": (
        lambda t: [*_corpus(t), f"ckpt_path={_regular_file(t)}"],
        ["a_file"],
    ),
}


def _drop(directory: Path, name: str) -> Path:
    (directory / name).unlink()
    return directory


def _truncated_gz(directory: Path, name: str) -> Path:
    """Replace ``name`` by a ``.gz`` copy cut in half (a download that stopped early)."""
    import gzip

    data = gzip.compress((directory / name).read_bytes() * 20)
    (directory / name).unlink()
    (directory / f"{name}.gz").write_bytes(data[: len(data) // 2])
    return directory


def _truncated_checkpoint(tmp: Path) -> Path:
    import torch

    path = tmp / "truncated.ckpt"
    torch.save({"state_dict": {"w": torch.zeros(1000)}, "global_step": 3}, path)
    path.write_bytes(path.read_bytes()[:1500])
    return path


def _foreign_checkpoint(tmp: Path) -> Path:
    """A Lightning-shaped checkpoint from another project."""
    import torch

    path = tmp / "foreign.ckpt"
    torch.save({"state_dict": {"layer.weight": torch.zeros(2, 2)}, "global_step": 3}, path)
    return path


def _regular_file(tmp: Path) -> Path:
    """A path under which nothing can be created, even by root (unlike chmod 500)."""
    path = tmp / "a_file"
    path.write_text("not a directory")
    return path


def _overrides(case: str, tmp_path: Path) -> list[str]:
    overrides = CASES[case][0](tmp_path)
    return overrides if "data=multi30k" in overrides else [*FILES_TRAIN, *overrides]


@pytest.mark.parametrize("case", sorted(set(CASES) - {"hub_unreachable"}))
def test_user_error_is_one_line_in_process(
    case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    overrides = _overrides(case, tmp_path)
    run_dir = tmp_path / "run"
    explicit = [o for o in overrides if o.startswith("run_dir=")]
    with pytest.raises(SystemExit) as exited:
        cfg = compose_train(run_dir, [o for o in overrides if not o.startswith("run_dir=")])
        if explicit:
            cfg.run_dir = explicit[-1].split("=", 1)[1]
        guarded(run)(cfg)
    assert exited.value.code == EXIT_USER_ERROR
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, lines
    for text in CASES[case][1]:
        assert text in lines[0]


def train_py(
    args: list[str], tmp_path: Path, env: dict[str, str] | None = None, timeout: float = 900
) -> subprocess.CompletedProcess[str]:
    """``python train.py ARGS`` in the project root, output under ``tmp_path``."""
    full_env = {k: v for k, v in os.environ.items() if k not in DEBUG_VARIABLES}
    full_env.update(OMP_NUM_THREADS="1", HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1")
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "train.py", f"hydra.run.dir={tmp_path / 'hydra'}", *args],
        cwd=ROOT,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def assert_clean_failure(result: subprocess.CompletedProcess[str], code: int) -> list[str]:
    """Exit ``code``, no traceback, exactly one ``error:`` line (returned)."""
    assert result.returncode == code, result.stderr[-3000:]
    assert "Traceback" not in result.stderr + result.stdout
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, result.stderr[-3000:]
    return lines


# The Hub case runs only here: HF_DATASETS_OFFLINE is read when `datasets` is imported.
@pytest.mark.parametrize(
    "case",
    [pytest.param(c, marks=[] if c == "hub_unreachable" else pytest.mark.slow) for c in CASES],
)
def test_user_error_is_one_line_from_train_py(case: str, tmp_path: Path) -> None:
    (line,) = assert_clean_failure(train_py(_overrides(case, tmp_path), tmp_path), 2)
    for text in CASES[case][1]:
        assert text in line


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("model.d_modle=3", ["Could not override 'model.d_modle'", "not in struct"]),
        ("model=huge", ["Could not find 'model/huge'", "Available options in 'model'", "tiny"]),
    ],
)
def test_config_composition_error_is_hydras_message(
    override: str, expected: list[str], tmp_path: Path
) -> None:
    result = train_py([override], tmp_path, timeout=900)
    assert result.returncode == EXIT_USER_ERROR, result.stderr
    assert "Traceback" not in result.stderr
    for text in expected:
        assert text in result.stderr


def test_debug_variable_shows_the_traceback(tmp_path: Path) -> None:
    result = train_py(
        ["data=files", "data.dir=/nope", "threads=1"],
        tmp_path,
        env={"TRANSFORMER_MT_DEBUG": "1"},
        timeout=900,
    )
    assert result.returncode == EXIT_USER_ERROR
    assert "Traceback" in result.stderr
    assert "error: Corpus directory not found: /nope" in result.stderr


def test_some_pairs_too_long_are_dropped_and_counted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    import hydra

    long = " ".join(["word"] * 200)
    corpus = write_corpus(tmp_path / "corpus")
    with open(corpus / "train.en", "a") as handle:
        handle.write(long + "\n")
    with open(corpus / "train.de", "a") as handle:
        handle.write("kurz\n")
    cfg = compose_train(tmp_path / "run", [*FILES_TRAIN, f"data.dir={corpus}"])
    from transformer_mt.data.datamodule import TranslationDataModule

    dm = TranslationDataModule(hydra.utils.instantiate(cfg.data), work_dir=tmp_path / "run")
    with caplog.at_level("WARNING"):
        dm.prepare_data()
        dm.setup("fit")
    assert len(dm.splits["train"]) == 30
    assert any("Dropped 1 of 31 training pairs" in r.getMessage() for r in caplog.records)


def test_full_disk_is_reported_at_start(tmp_path: Path) -> None:
    """A 256 KiB tmpfs cannot take check_output_dir's 1 MiB probe (needs root + mount)."""
    mount = tmp_path / "small"
    mount.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mount)], capture_output=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {done.stderr.decode().strip()}")
    try:
        with pytest.raises(OSError, match="No space left on device; free some disk space"):
            check_output_dir(mount / "run")
        assert list((mount / "run").iterdir()) == []  # the probe file is removed as well
    finally:
        subprocess.run(["umount", str(mount)], check=False)


# ------------------------------------------------------------------------------ cli units


@pytest.mark.parametrize(
    ("exc", "code"),
    [
        (ValueError("x"), EXIT_USER_ERROR),
        (FileNotFoundError("x"), EXIT_USER_ERROR),
        (ConnectionError("x"), EXIT_USER_ERROR),
        (PermissionError("x"), EXIT_USER_ERROR),
        (UserError("x"), EXIT_USER_ERROR),
        (NonFiniteLossError("x"), EXIT_RUNTIME_ERROR),
        (TrainingInterrupted("x"), EXIT_INTERRUPTED),
        (KeyboardInterrupt(), EXIT_INTERRUPTED),
        (RuntimeError("a bug"), None),
        (AttributeError("a bug"), None),
    ],
)
def test_exit_codes(exc: BaseException, code: int | None) -> None:
    assert exit_code_for(exc) == code


def test_instantiation_errors_are_unwrapped() -> None:
    from hydra.errors import InstantiationException

    try:
        try:
            raise ValueError("max_tokens=10 is too small;\n raise data.max_tokens")
        except ValueError as inner:
            raise InstantiationException("Error in call to target 'x':\nValueError(...)") from inner
    except InstantiationException as outer:
        assert exit_code_for(outer) == EXIT_USER_ERROR
        assert one_line(outer) == "max_tokens=10 is too small; raise data.max_tokens"


def test_unknown_constructor_argument_is_a_user_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = compose_train(tmp_path, [*FAST_TRAIN, "+data.max_tokenz=5"])
    with pytest.raises(SystemExit) as exited:
        guarded(run)(cfg)
    assert exited.value.code == EXIT_USER_ERROR
    assert "max_tokenz" in capsys.readouterr().err


def test_bugs_keep_their_traceback() -> None:
    @guarded
    def buggy() -> None:
        raise RuntimeError("internal invariant broken")

    with pytest.raises(RuntimeError, match="internal invariant"):
        buggy()


# ------------------------------------------------------- start-up checks and the run lock


def test_shipped_data_and_model_configs_fit_the_positional_table(tmp_path: Path) -> None:
    """Under the defaults a sentence of data.max_len tokens + <bos>/<eos> fits model.max_len."""
    from transformer_mt.training.checks import check_max_len

    configs = ROOT / "configs"
    for data in sorted(p.stem for p in (configs / "data").glob("*.yaml")):
        for model in sorted(p.stem for p in (configs / "model").glob("*.yaml")):
            cfg = compose_train(tmp_path, [f"data={data}", f"model={model}"])
            check_max_len(cfg.data.max_len, cfg.model.max_len)  # raises if it does not fit
    for experiment in sorted(p.stem for p in (configs / "experiment").glob("*.yaml")):
        cfg = compose_train(tmp_path, [f"experiment={experiment}"])
        check_max_len(cfg.data.max_len, cfg.model.max_len)


def test_over_long_validation_sentence_is_truncated_not_fatal(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A 200-word validation line under limits that fit: validated, counted, no crash."""
    corpus = write_corpus(tmp_path / "corpus")
    for lang in ("en", "de"):
        with open(corpus / f"val.{lang}", "a") as handle:
            handle.write(" ".join(["wort"] * 200) + "\n")
    cfg = compose_train(
        tmp_path / "run",
        [*FILES_TRAIN, f"data.dir={corpus}", "data.max_len=63", "model.max_len=64"],
    )
    with caplog.at_level("WARNING"):
        run(cfg)
    assert any("truncated" in r.getMessage() for r in caplog.records)
    assert (tmp_path / "run" / "checkpoints" / "last.ckpt").is_file()


def test_unwritable_hydra_run_dir_is_one_line(tmp_path: Path) -> None:
    """Hydra creates hydra.run.dir before the task runs: RunDirGuard answers for it."""
    target = _regular_file(tmp_path)
    result = subprocess.run(
        [sys.executable, "train.py", f"hydra.run.dir={target}/run", *FILES_TRAIN, "data.dir=x"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
        env={k: v for k, v in os.environ.items() if k not in DEBUG_VARIABLES},
    )
    (line,) = assert_clean_failure(result, EXIT_USER_ERROR)
    assert f"cannot write to the run directory {target}/run: Not a directory" in line
    assert "hydra.run.dir=PATH" in line


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
    (line,) = [x for x in capsys.readouterr().err.splitlines() if x.startswith("error:")]
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
    (line,) = [x for x in capsys.readouterr().err.splitlines() if x.startswith("error:")]
    assert "not enough disk space for the checkpoints of this run" in line
    assert "save_top_k" in line
    assert not (tiny_disk / "run" / "checkpoints").exists()


def test_skipping_non_finite_losses_stops_once_the_weights_are_nan(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = compose_train(
        tmp_path,
        [
            *FAST_TRAIN,
            "optimizer.lr=1e30",
            "trainer.gradient_clip_val=null",
            "module.nonfinite_loss=skip",
            "module.warmup_steps=1",
        ],
    )
    with pytest.raises(SystemExit) as exited:
        guarded(run)(cfg)
    assert exited.value.code == EXIT_RUNTIME_ERROR
    (line,) = [x for x in capsys.readouterr().err.splitlines() if x.startswith("error:")]
    assert "so module.nonfinite_loss=skip cannot recover" in line and "lower optimizer.lr" in line
    assert "the weights themselves are NaN/inf" in line or "10 batches in a row" in line


def _short_run(run_dir: Path, corpus: Path, *extra: str) -> Path:
    run(compose_train(run_dir, [*FILES_TRAIN, f"data.dir={corpus}", "trainer.max_steps=2", *extra]))
    return run_dir / "checkpoints" / "last.ckpt"


@pytest.mark.parametrize("change", ["vocab_size", "same_size", "model_shape"])
def test_resume_with_another_tokenizer_or_model_is_refused(
    tmp_path: Path, change: str, capsys: pytest.CaptureFixture[str]
) -> None:
    ckpt = _short_run(tmp_path / "first", write_corpus(tmp_path / "a"), "test_after_fit=false")
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
    (line,) = [x for x in capsys.readouterr().err.splitlines() if x.startswith("error:")]
    assert f"cannot resume from {ckpt}: " in line
    assert expected in line


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
    (line,) = [x for x in capsys.readouterr().err.splitlines() if x.startswith("error:")]
    assert (
        f"the run directory {run_dir} is in use by another training run (PID {holder.pid}" in line
    )
    assert not (run_dir / "tokenizer.json").exists()  # nothing of the holder's was touched


def test_lock_of_a_killed_run_is_recovered_and_summary_names_own_checkpoints(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import signal

    import torch

    run_dir = tmp_path / "run"
    corpus = write_corpus(tmp_path / "c")
    _short_run(run_dir, corpus, "test_after_fit=false")  # an earlier run left last.ckpt here
    holder = _lock_holder(run_dir)
    holder.send_signal(signal.SIGKILL)  # dies holding the lock
    holder.wait()
    capsys.readouterr()
    first = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)["global_step"]
    ckpt = _short_run(run_dir, corpus, "test_after_fit=false", "trainer.max_epochs=2")
    out = capsys.readouterr().out
    own = run_dir / "checkpoints" / "last-v1.ckpt"  # Lightning does not overwrite last.ckpt
    assert own.is_file() and ckpt.is_file()
    assert torch.load(own, weights_only=True)["global_step"] == 2 * first
    flat = "".join(ch for ch in out if not ch.isspace() and ch not in "│┃|")
    assert f"lastcheckpoint{own}" in flat  # this run's file, not the earlier run's last.ckpt
