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

from conftest import FAST_TRAIN, compose_train

ROOT = Path(__file__).resolve().parents[1]
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
}


def _drop(directory: Path, name: str) -> Path:
    (directory / name).unlink()
    return directory


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
    args: list[str], tmp_path: Path, env: dict[str, str] | None = None, timeout: float = 120
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
    result = train_py([override], tmp_path, timeout=60)
    assert result.returncode == EXIT_USER_ERROR, result.stderr
    assert "Traceback" not in result.stderr
    for text in expected:
        assert text in result.stderr


def test_debug_variable_shows_the_traceback(tmp_path: Path) -> None:
    result = train_py(
        ["data=files", "data.dir=/nope", "threads=1"],
        tmp_path,
        env={"TRANSFORMER_MT_DEBUG": "1"},
        timeout=60,
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
