"""Target word dropout: what it drops, what it never touches, and that training uses it."""

from __future__ import annotations

import csv
import re
from pathlib import Path

import pytest
import torch

from transformer_mt.data.tokenizer import BOS_ID, PAD_ID, UNK_ID
from transformer_mt.training.config import TrainingConfig
from transformer_mt.training.loss import target_word_dropout

from conftest import FAST_TRAIN, compose_train


def decoder_input() -> torch.Tensor:
    torch.manual_seed(0)
    rows = torch.randint(4, 50, (64, 12))
    rows[:, 0] = BOS_ID
    rows[:32, 8:] = PAD_ID  # half the rows end early
    return rows


@pytest.mark.parametrize(("mode", "fill"), [("unk", UNK_ID), ("zero", PAD_ID)])
def test_drops_about_p_of_the_words_and_never_bos_or_padding(mode: str, fill: int) -> None:
    tgt_in = decoder_input()
    out = target_word_dropout(tgt_in, 0.25, mode, pad_id=PAD_ID, unk_id=UNK_ID)
    words = (tgt_in != PAD_ID) & (tgt_in != BOS_ID)
    dropped = out != tgt_in
    assert torch.equal(out[:, 0], tgt_in[:, 0])
    assert not dropped[tgt_in == PAD_ID].any()
    assert (out[dropped] == fill).all()
    share = dropped.sum().item() / words.sum().item()
    assert 0.18 < share < 0.32
    assert target_word_dropout(tgt_in, 0.0, mode, pad_id=PAD_ID, unk_id=UNK_ID) is tgt_in


def test_bad_settings_are_one_line() -> None:
    with pytest.raises(ValueError, match=r"module.word_dropout must be in \[0, 1\)"):
        TrainingConfig(word_dropout=1.0)
    with pytest.raises(ValueError, match=r"module\.word_dropout_mode must be one of unk, zero"):
        TrainingConfig(word_dropout_mode="blank")


def test_training_perturbs_the_decoder_input_and_evaluation_does_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The training step feeds the model a perturbed target prefix; validation the true one."""
    from transformer_mt.model.transformer import Transformer
    from transformer_mt.training.run import run

    seen: dict[bool, list[bool]] = {True: [], False: []}
    forward = Transformer.forward

    def recording(self, src, tgt_in):
        seen[self.training].append(bool((tgt_in == UNK_ID).any()))
        return forward(self, src, tgt_in)

    monkeypatch.setattr(Transformer, "forward", recording)
    run(compose_train(tmp_path / "run", [*FAST_TRAIN, "module.word_dropout=0.3"]))
    assert seen[True] and all(seen[True])
    assert seen[False] and not any(seen[False])


def test_average_last_is_the_run_result(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """average_last=N writes the average of the last N epoch checkpoints, validates it (the
    returned metric), tests it in place of the best checkpoint and names it in the summary."""
    from transformer_mt.checkpoint import CHECKPOINT_KEY, load_checkpoint
    from transformer_mt.training.run import run

    settings = [
        *(o for o in FAST_TRAIN if o not in ("callbacks=none", "trainer.max_epochs=1")),
        "callbacks=default",
        "callbacks.progress_bar=null",
        "trainer.max_epochs=3",
        "average_last=2",
        "optimized_metric=val/loss",  # BLEU of a model this tiny is 0 either way
    ]
    run_dir = tmp_path / "run"
    metric = run(compose_train(run_dir, settings))
    average = run_dir / "checkpoints" / "average-last2.ckpt"
    meta = load_checkpoint(average)[CHECKPOINT_KEY]
    names = [Path(p).name for p in meta["averaged_from"]]
    assert [n[:15] for n in names] == ["recent-epoch001", "recent-epoch002"]
    assert len(list((run_dir / "checkpoints").glob("recent-*.ckpt"))) == 3
    out = capsys.readouterr().out
    assert "average of the last 2" in out and "average-last2.ckpt" in out
    assert re.search(rf"average val/loss +│ {metric:.3f}", out)
    with open(next(run_dir.rglob("metrics.csv")), newline="") as f:
        epoch_losses = [float(r["val/loss"]) for r in csv.DictReader(f) if r.get("val/loss")]
    # Three validations during training, then the average's, which is what the run returns.
    assert len(epoch_losses) == 4 and epoch_losses[-1] == pytest.approx(metric)
    assert metric != pytest.approx(epoch_losses[2])


def test_average_last_without_kept_checkpoints_is_refused_before_training(
    tmp_path: Path,
) -> None:
    from transformer_mt.errors import UserError
    from transformer_mt.training.run import run

    with pytest.raises(
        UserError, match=r"but save_top_k is 2; set callbacks\.recent_checkpoints\.save_top_k=3"
    ):
        run(
            compose_train(
                tmp_path / "run",
                [*FAST_TRAIN, "average_last=3", "callbacks.recent_checkpoints.save_top_k=2"],
            )
        )
    assert not (tmp_path / "run" / "checkpoints").exists()
