"""scripts/: average_checkpoints, plot_attention and plot_metrics on the shared tiny run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from transformer_mt.checkpoint import load_checkpoint, load_model

from conftest import best_checkpoint, short_run, train_tiny_run, write_corpus
from conftest import load_script as script


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return train_tiny_run(tmp_path_factory.getbasetemp() / "tiny_run")


def is_png(path: Path) -> bool:
    return path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_average_checkpoints_script(run_dir: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "avg.ckpt"
    assert script("average_checkpoints").main([str(run_dir), "--last", "2", "-o", str(out)]) == 0
    assert load_model(out).config.d_model == 32
    copy = tmp_path / "copy.ckpt"
    ckpt = best_checkpoint(run_dir)
    assert (
        script("average_checkpoints").main(["--inputs", str(ckpt), str(ckpt), "-o", str(copy)]) == 0
    )
    a, b = load_checkpoint(ckpt)["state_dict"], load_checkpoint(copy)["state_dict"]
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert script("average_checkpoints").main([str(run_dir), "--best", "50", "-o", str(out)]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()[-1:]
    assert line.startswith("error: ") and "fewer than the 50 asked for" in line


def test_average_checkpoints_never_replaces_a_run_checkpoint(
    run_dir: Path, tmp_path: Path, capsys
) -> None:
    """-o over a run's checkpoint is refused with the file unchanged; an earlier average is
    replaced only with --force."""
    last = tmp_path / "last.ckpt"
    last.write_bytes(best_checkpoint(run_dir).read_bytes())
    before = last.read_bytes()
    average = script("average_checkpoints").main
    assert average([str(run_dir), "--last", "2", "-o", str(last)]) == 2
    assert "is not an average of checkpoints" in capsys.readouterr().err
    assert last.read_bytes() == before
    out = tmp_path / "avg.ckpt"
    assert average([str(run_dir), "--last", "2", "-o", str(out)]) == 0
    assert average([str(run_dir), "--last", "2", "-o", str(out)]) == 2
    assert "pass --force" in capsys.readouterr().err
    assert average([str(run_dir), "--last", "2", "-o", str(out), "--force"]) == 0


def test_an_average_cannot_resume_and_its_suggested_fix_trains(
    run_dir: Path, tmp_path: Path
) -> None:
    """ckpt_path= of an averaged checkpoint is one line naming init_from=; running that fix
    trains."""
    from transformer_mt.errors import UserError
    from transformer_mt.training.checks import check_resume_checkpoint

    out = tmp_path / "avg.ckpt"
    assert script("average_checkpoints").main([str(run_dir), "--last", "2", "-o", str(out)]) == 0
    with pytest.raises(UserError, match=f"init_from={out} instead of ckpt_path="):
        check_resume_checkpoint(out, {})
    corpus = write_corpus(tmp_path / "corpus")
    last = short_run(tmp_path / "fine", corpus, f"init_from={out}")
    assert last.is_file()


def test_plot_attention(run_dir: Path, tmp_path: Path) -> None:
    mod = script("plot_attention")
    loaded = load_model(best_checkpoint(run_dir))
    src, out, tgt_in, maps, _ = mod.attention_maps(loaded, "Anna has two apples.", max_len_b=5)
    n_layers = loaded.config.n_encoder_layers
    heads = loaded.config.n_heads
    assert len(maps["encoder_self"]) == n_layers
    assert maps["encoder_self"][0].shape == (heads, len(src), len(src))
    assert maps["decoder_self"][0].shape == (heads, len(out), len(tgt_in))
    assert maps["cross"][0].shape == (heads, len(out), len(src))
    torch.testing.assert_close(maps["cross"][0].sum(-1), torch.ones(heads, len(out)))
    # Causal: no weight on future decoder positions.
    assert float(maps["decoder_self"][0].triu(1).abs().sum()) == 0.0
    ckpt = str(best_checkpoint(run_dir))
    assert (
        mod.main(["--ckpt", ckpt, "Anna has two apples.", "-o", str(tmp_path), "--only", "cross"])
        == 0
    )
    assert is_png(tmp_path / "cross.png")
    # The recording hooks are gone: the model is left as it was.
    assert not any(m._forward_hooks for m in loaded.model.modules())


def test_plot_metrics(run_dir: Path, tmp_path: Path) -> None:
    mod = script("plot_metrics")
    series = mod.read_metrics(run_dir / "csv" / "metrics.csv")
    assert "train/loss" in series and "val/bleu" in series
    out = tmp_path / "curves.png"
    assert mod.main([str(run_dir), "-o", str(out)]) == 0
    assert is_png(out)
    assert mod.main([str(tmp_path / "nothing")]) == 1


def test_record_run_writes_a_record_and_replaces_only_its_own(
    tiny_run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from conftest import evaluate

    record_main = script("record_run").main
    evaluate(tmp_path / "eval", f"ckpt_path={best_checkpoint(tiny_run_dir)}")
    results = tmp_path / "eval" / "results.json"
    args = [str(tiny_run_dir), "--name", "tiny", "--out", str(tmp_path / "runs")]
    args += ["--eval", f"greedy={results}"]
    assert record_main(args) == 0
    record = json.loads((tmp_path / "runs" / "tiny.json").read_text(encoding="utf-8"))
    assert record["source"]["commit"] and record["machine"]["cpu"]
    assert record["training"]["steps"] > 0
    evaluated = json.loads(results.read_text(encoding="utf-8"))["metrics"]
    assert record["evaluations"]["greedy"]["metrics"] == {
        k: round(float(v), 2) for k, v in evaluated.items()
    }  # the record holds evaluate.py's figures, rounded as the README shows them
    capsys.readouterr()
    assert record_main(args) == 2  # exists: only --force replaces it
    assert "pass --force" in capsys.readouterr().err
    assert record_main([*args, "--force"]) == 0
    (tmp_path / "runs" / "notes.json").write_text("{}", encoding="utf-8")
    other = [str(tiny_run_dir), "--name", "notes", "--out", str(tmp_path / "runs")]
    assert record_main(other) == 2  # not a record: never replaced
    assert (tmp_path / "runs" / "notes.json").read_text(encoding="utf-8") == "{}"


def test_record_counts_the_steps_of_a_run_ended_between_log_rows(tmp_path: Path) -> None:
    from transformer_mt.checkpoint import save_checkpoint

    (tmp_path / "csv").mkdir()
    rows = ["epoch,step,train/tokens_per_sec,val/bleu", "0,25,1000,", "0,49,,10.0"]
    (tmp_path / "csv" / "metrics.csv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    facts = script("record_run").training_facts
    assert facts(tmp_path)["steps"] == 49  # no checkpoint: the last logged row
    (tmp_path / "checkpoints").mkdir()
    save_checkpoint({"state_dict": {}, "global_step": 56}, tmp_path / "checkpoints" / "last.ckpt")
    assert facts(tmp_path)["steps"] == 56  # max_steps ended it past the last logged row
