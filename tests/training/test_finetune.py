"""Fine-tuning (``init_from=CKPT``, ``freeze=[...]``): starts where the checkpoint is, exactly.

A tiny base run (two epochs of the numbers data) is the checkpoint. A fine-tuning run built
from it scores at its first validation what the base run logged for that checkpoint (same
weights, same tokenizer, same data); frozen parts keep the checkpoint's weights; a resumed
fine-tuning run ends where the uninterrupted one does; and misuse is one ``error:`` line.
"""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import torch

from transformer_mt.checkpoint import load_checkpoint, load_model
from transformer_mt.data.tokenizer import Tokenizer
from transformer_mt.errors import EXIT_USER_ERROR, UserError, guarded
from transformer_mt.training.finetune import check_tokenizer_settings, finetune_model_config
from transformer_mt.training.run import prepare_and_build, run

from conftest import FAST_TRAIN, compose_train

BASE = [
    *FAST_TRAIN,
    "trainer.max_epochs=2",
    "trainer.log_every_n_steps=1",
    "module.warmup_steps=10",
    "optimizer.lr=3e-3",
    "test_after_fit=false",
]
#: The fine-tuning runs: other data settings that must not matter (the tokenizer is adopted).
FINETUNE = [
    *BASE,
    "trainer.max_epochs=1",
    "data.vocab_size=200",
    "model.dropout=0.1",  # may change; the random stream must continue exactly on resume
    "callbacks.recent_checkpoints.every_n_train_steps=5",
    "callbacks.recent_checkpoints.save_top_k=-1",
]


@pytest.fixture(scope="module")
def base_ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("base")
    run(compose_train(run_dir, BASE))
    return run_dir / "checkpoints" / "last.ckpt"


def last_logged(run_dir: Path, name: str) -> float:
    with open(run_dir / "csv" / "metrics.csv", newline="") as f:
        values = [row[name] for row in csv.DictReader(f) if row.get(name)]
    return float(values[-1])


def test_first_validation_scores_what_the_checkpoint_scored(base_ckpt: Path, tmp_path: Path):
    datamodule, module, trainer = prepare_and_build(
        compose_train(tmp_path, [*FINETUNE, f"init_from={base_ckpt}"])
    )
    assert datamodule.tokenizer.to_json() == load_model(base_ckpt).tokenizer.to_json()
    assert (tmp_path / "tokenizer.json").is_file()  # saved like a trained one
    (val,) = trainer.validate(module, datamodule=datamodule, verbose=False)
    base_dir = base_ckpt.parents[1]
    assert val["val/loss"] == pytest.approx(last_logged(base_dir, "val/loss"), rel=1e-6)
    assert val["val/bleu"] == pytest.approx(last_logged(base_dir, "val/bleu"), abs=1e-6)
    assert trainer.global_step == 0  # a fresh step count, optimizer and schedule


def test_freeze_keeps_the_named_parts(base_ckpt: Path, tmp_path: Path) -> None:
    overrides = [*FINETUNE, f"init_from={base_ckpt}", "freeze=[encoder]", "trainer.max_steps=5"]
    run(compose_train(tmp_path, overrides))
    start = load_checkpoint(base_ckpt)["state_dict"]
    end = load_checkpoint(tmp_path / "checkpoints" / "last.ckpt")["state_dict"]
    assert load_checkpoint(tmp_path / "checkpoints" / "last.ckpt")["global_step"] == 5
    encoder = [k for k in start if k.startswith("model.encoder.")]
    assert encoder and all(torch.equal(start[k], end[k]) for k in encoder)
    decoder = [k for k in start if k.startswith("model.decoder.layers.")]
    assert any(not torch.equal(start[k], end[k]) for k in decoder)


@pytest.mark.slow
def test_resumed_finetuning_is_exact(base_ckpt: Path, tmp_path: Path) -> None:
    overrides = [*FINETUNE, f"init_from={base_ckpt}", "freeze=[embeddings]"]
    run(compose_train(tmp_path / "whole", overrides))
    (ckpt,) = (tmp_path / "whole" / "checkpoints").glob("recent-*-step000010.ckpt")
    run(compose_train(tmp_path / "resumed", [*overrides, f"ckpt_path={ckpt}"]))
    want = load_checkpoint(tmp_path / "whole" / "checkpoints" / "last.ckpt")
    got = load_checkpoint(tmp_path / "resumed" / "checkpoints" / "last.ckpt")
    assert got["global_step"] == want["global_step"] > 10
    assert got["state_dict"].keys() == want["state_dict"].keys()
    for name, value in want["state_dict"].items():
        torch.testing.assert_close(got["state_dict"][name], value, rtol=0, atol=0, msg=name)


def one_error_line(capsys: pytest.CaptureFixture[str], run_dir: Path, overrides: list[str]) -> str:
    with pytest.raises(SystemExit) as exited:
        guarded(run)(compose_train(run_dir, overrides))
    assert exited.value.code == EXIT_USER_ERROR
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, lines
    return lines[0]


def test_freeze_of_a_missing_part_is_one_error_line(
    base_ckpt: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    line = one_error_line(
        capsys, tmp_path, [*FINETUNE, f"init_from={base_ckpt}", "freeze=[encodr]"]
    )
    assert "freeze names a part that does not exist: 'encodr'" in line
    assert not (tmp_path / "checkpoints").exists()


def test_init_from_a_file_that_is_not_a_checkpoint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    notes = tmp_path / "notes.txt"
    notes.write_text("not a model\n")
    line = one_error_line(capsys, tmp_path / "run", [*FINETUNE, f"init_from={notes}"])
    assert line.startswith(f"error: init_from: {notes} is not a PyTorch checkpoint")


def test_init_from_another_vocabulary_than_the_run_dir_holds(
    base_ckpt: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    texts = [["one two three four five six seven eight nine ten"] * 4]
    other = Tokenizer.train(texts, texts, vocab_size=280, src_lang="en", tgt_lang="de")
    other.save(tmp_path)
    before = (tmp_path / "tokenizer.json").read_bytes()
    line = one_error_line(capsys, tmp_path, [*FINETUNE, f"init_from={base_ckpt}"])
    assert "has another vocabulary than the tokenizer already in" in line
    assert (tmp_path / "tokenizer.json").read_bytes() == before  # not overwritten


def test_init_from_another_direction_names_fixes_that_work(
    base_ckpt: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An en->de checkpoint on de->en data: one line whose first fix, run, trains."""
    flipped = [*FINETUNE, f"init_from={base_ckpt}", "data.src_lang=de", "data.tgt_lang=en"]
    line = one_error_line(capsys, tmp_path / "wrong", flipped)
    assert "translates en->de, the data de->en" in line
    assert "(data.src_lang=en data.tgt_lang=de)" in line
    fixed = [*FINETUNE, f"init_from={base_ckpt}", "data.src_lang=en", "data.tgt_lang=de"]
    run(compose_train(tmp_path / "fixed", [*fixed, "trainer.max_steps=2"]))
    assert (tmp_path / "fixed" / "checkpoints" / "last.ckpt").is_file()


def test_settings_given_on_the_command_line_must_match(base_ckpt: Path) -> None:
    init = load_model(base_ckpt)
    saved = init.config.to_dict()
    same = finetune_model_config(init, {**saved, "dropout": 0.3}, explicit={"*"})
    assert same.dropout == 0.3 and same.d_model == saved["d_model"]
    # Not given on the command line: the checkpoint's value wins without a word.
    quiet = finetune_model_config(init, {**saved, "d_model": 64}, explicit=set())
    assert quiet.d_model == saved["d_model"]
    with pytest.raises(UserError, match=r"model\.d_model=64 \(checkpoint: 32\)"):
        finetune_model_config(init, {**saved, "d_model": 64}, explicit={"d_model"})
    with pytest.raises(UserError, match=r"data\.vocab_size=200 \(checkpoint: "):
        check_tokenizer_settings(init, {"vocab_size": 200}, explicit={"vocab_size"})
    check_tokenizer_settings(init, {"vocab_size": 200}, explicit=set())
