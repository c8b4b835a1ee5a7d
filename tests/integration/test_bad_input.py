"""The bad-input catalogue (docs/errors.md): every user mistake is one `error:` line, no traceback.

Each case runs ``train.py``'s guarded pipeline in-process (fast) and, marked slow, as a real
``python train.py`` subprocess. A config that does not compose (wrong type, unknown key) fails
in Hydra's compose, checked in-process and, for two of them, through ``python train.py``.
"""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest
import torch
from hydra.errors import HydraException

from transformer_mt.cli.hydra_app import composition_error
from transformer_mt.errors import EXIT_USER_ERROR, exit_code_for, guarded
from transformer_mt.training.run import run

from conftest import (
    FAST_TRAIN,
    FILES_TRAIN,
    FIXTURES,
    compose_train,
    error_line,
    regular_file,
    train_py,
    write_corpus,
)

#: FAST_TRAIN without the keys that exist only in the generated (numbers) data config.
BASE_TRAIN = [o for o in FAST_TRAIN if not o.startswith("data.")]


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
        ["source=files needs a directory: set data.dir", "data.dir=../shared/data/multi30k"],
    ),
    "unwritable_run_dir": (
        lambda t: [*_corpus(t), f"run_dir={regular_file(t)}/run"],
        ["cannot write to the run directory", "Not a directory", "run_dir=PATH"],
    ),
    "max_len_beyond_positional_table": (
        lambda t: [*_corpus(t), "model.max_len=64"],  # FILES_TRAIN: data.max_len=64
        ["data.max_len=64 does not fit model.max_len=64", "data.max_len=63", "model.max_len=65"],
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
        lambda t: [*_corpus(t), f"ckpt_path={regular_file(t)}"],
        ["a_file"],
    ),
    # What the config alone decides is refused before the data (data.dir=/nope) is looked at.
    "model_shape_before_data": (
        lambda t: ["data.dir=/nope", "model.d_model=30", "model.n_heads=4"],
        ["model.d_model=30 is not divisible by model.n_heads=4"],
    ),
    "max_time_not_a_duration": (
        lambda t: ["data.dir=/nope", "trainer.max_time=banana"],
        ["trainer.max_time='banana' is not a duration", "DD:HH:MM:SS"],
    ),
    "precision_unknown": (
        lambda t: ["data.dir=/nope", "trainer.precision=banana"],
        ["trainer.precision=banana is not a precision", "auto", "bf16-mixed"],
    ),
    "ema_run_resumed_without_ema": (
        lambda t: [*_corpus(t), f"ckpt_path={_ema_checkpoint(t)}"],
        ["without its weight average", "add callbacks=ema"],
    ),
}


def _drop(directory: Path, name: str) -> Path:
    (directory / name).unlink()
    return directory


def _truncated_gz(directory: Path, name: str) -> Path:
    """Replace ``name`` by a ``.gz`` copy cut in half (a download that stopped early)."""
    data = gzip.compress((directory / name).read_bytes() * 20)
    (directory / name).unlink()
    (directory / f"{name}.gz").write_bytes(data[: len(data) // 2])
    return directory


def _truncated_checkpoint(tmp: Path) -> Path:
    path = tmp / "truncated.ckpt"
    torch.save({"state_dict": {"w": torch.zeros(1000)}, "global_step": 3}, path)
    path.write_bytes(path.read_bytes()[:1500])
    return path


def _foreign_checkpoint(tmp: Path) -> Path:
    """A Lightning-shaped checkpoint from another project."""
    path = tmp / "foreign.ckpt"
    torch.save({"state_dict": {"layer.weight": torch.zeros(2, 2)}, "global_step": 3}, path)
    return path


def _ema_checkpoint(tmp: Path) -> Path:
    """A resumable checkpoint of a run that averaged its weights (callbacks=ema): the average
    as its weights, the raw weights beside them."""
    checkpoint = torch.load(FIXTURES / "format_v1" / "model.ckpt", weights_only=True)
    checkpoint["optimizer_states"] = [{}]
    checkpoint["current_model_state"] = dict(checkpoint["state_dict"])
    path = tmp / "ema.ckpt"
    torch.save(checkpoint, path)
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
    line = error_line(capsys.readouterr().err)
    for text in CASES[case][1]:
        assert text in line


# The Hub case runs only here: HF_DATASETS_OFFLINE is read when `datasets` is imported.
@pytest.mark.parametrize(
    "case",
    [pytest.param(c, marks=[] if c == "hub_unreachable" else pytest.mark.slow) for c in CASES],
)
def test_user_error_is_one_line_from_train_py(case: str, tmp_path: Path) -> None:
    result = train_py(_overrides(case, tmp_path), tmp_path / "hydra")
    assert result.returncode == EXIT_USER_ERROR, result.stderr[-3000:]
    line = error_line(result.stderr)
    for text in CASES[case][1]:
        assert text in line


#: Overrides that do not compose -> what the one error line says (Hydra's message and cause).
COMPOSITION_ERRORS = {
    "model.d_modle=3": ["Could not override 'model.d_modle'", "Key 'd_modle' not in 'ModelGroup'"],
    "model=huge": ["Could not find 'model/huge'", "Available options in 'model'", "tiny"],
    "model.d_model=abc": ["model.d_model", "'abc' of type 'str' could not be converted to Integer"],
    "threads=many": ["threads", "'many' of type 'str' could not be converted to Integer"],
}


@pytest.mark.parametrize("override", ["model.d_modle=3", "model.d_model=abc"])
def test_config_composition_error_is_one_line_from_train_py(override: str, tmp_path: Path) -> None:
    result = train_py([override], tmp_path / "hydra")
    assert result.returncode == EXIT_USER_ERROR, result.stderr[-3000:]
    line = error_line(result.stderr)
    for text in COMPOSITION_ERRORS[override]:
        assert text in line
    assert "--cfg job" in line


@pytest.mark.parametrize("override", sorted(COMPOSITION_ERRORS))
def test_config_that_does_not_compose_is_a_user_error(override: str, tmp_path: Path) -> None:
    """The schema (training/config.py) rejects wrong types and unknown keys at composition."""
    with pytest.raises(HydraException) as raised:
        compose_train(tmp_path, [*FAST_TRAIN, override])
    assert exit_code_for(raised.value) == EXIT_USER_ERROR
    line = composition_error(raised.value)
    assert "\n" not in line
    for text in COMPOSITION_ERRORS[override]:
        assert text in line


def test_debug_variable_shows_the_traceback(tmp_path: Path) -> None:
    result = train_py(
        ["data=files", "data.dir=/nope", "threads=1"],
        tmp_path / "hydra",
        env={"TRANSFORMER_MT_DEBUG": "1"},
    )
    assert result.returncode == EXIT_USER_ERROR
    assert "Traceback" in result.stderr
    assert "error: Corpus directory not found: /nope" in result.stderr


def test_unknown_constructor_argument_is_a_user_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A key added with + passes composition (Hydra forces it in); the typed settings refuse it."""
    cfg = compose_train(tmp_path, [*FAST_TRAIN, "+data.max_tokenz=5"])
    with pytest.raises(SystemExit) as exited:
        guarded(run)(cfg)
    assert exited.value.code == EXIT_USER_ERROR
    assert "max_tokenz" in capsys.readouterr().err
