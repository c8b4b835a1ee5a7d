"""evaluate.py: train-then-evaluate gives the trainer's test scores; results.json; errors.

The tiny run (conftest.tiny_run_dir) is trained once per session and shared with the
translate, decode, checkpoint and scripts tests.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from transformer_mt.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from transformer_mt.inference.eval_data import DataMismatchError

from conftest import DATA_OVERRIDES, ROOT, best_checkpoint, evaluate, trainer_test_metrics


def test_bleu_equals_trainer_test_bleu(tiny_run_dir: Path, tmp_path: Path) -> None:
    """train.run tests the best checkpoint; evaluate.py on it, same decoding, same scores."""
    expected = trainer_test_metrics(tiny_run_dir)
    results = evaluate(tmp_path, f"ckpt_path={best_checkpoint(tiny_run_dir)}")
    assert results["data"]["origin"] == "checkpoint"  # the data config stored by train.py
    assert results["metrics"]["bleu"] == pytest.approx(expected["test/bleu"], abs=0.01)
    assert results["metrics"]["chrf"] == pytest.approx(expected["test/chrf"], abs=0.01)
    assert results["metrics"]["bleu_lc"] == pytest.approx(expected["test/bleu_lc"], abs=0.01)
    assert results["metrics"]["bleu_tok"] == pytest.approx(expected["test/bleu_tok"], abs=0.01)


def test_results_json_fields_and_hypotheses(tiny_run_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "sub" / "res.json"
    results = evaluate(
        tmp_path,
        f"ckpt_path={best_checkpoint(tiny_run_dir)}",
        f"results_path={out}",
        "batch.sentences=7",
        "decoding.beam_size=2",
    )
    saved = json.loads(out.read_text())
    for key in (
        "metrics",
        "signature",
        "checkpoint",
        "data",
        "decoding",
        "n_sentences",
        "decoding_time_s",
        "sentences_per_s",
    ):
        assert key in saved, key
    assert set(saved["metrics"]) == {"bleu", "bleu_lc", "bleu_tok", "chrf"}
    assert "tok:13a" in saved["signature"]["bleu"] and "case:mixed" in saved["signature"]["bleu"]
    assert saved["n_sentences"] == 40
    assert saved["decoding"]["beam_size"] == 2 and saved["decoding"]["batch_sentences"] == 7
    hyps = Path(results["hypotheses_path"]).read_text(encoding="utf-8").split("\n")
    assert len(hyps) == 41 and hyps[-1] == ""  # one line per sentence


def test_data_config_stored_in_checkpoint_is_used(tiny_run_dir: Path, tmp_path: Path) -> None:
    """A checkpoint that stores its data config (transformer_mt.data) needs no run directory."""
    ckpt = load_checkpoint(best_checkpoint(tiny_run_dir))
    train_cfg = OmegaConf.load(tiny_run_dir / ".hydra" / "config.yaml")
    ckpt["transformer_mt"]["data"] = OmegaConf.to_container(train_cfg.data, resolve=True)
    lone = save_checkpoint(ckpt, tmp_path / "alone" / "model.ckpt")
    results = evaluate(tmp_path, f"ckpt_path={lone}")
    assert results["data"]["origin"] == "checkpoint"
    assert results["metrics"]["chrf"] == pytest.approx(
        trainer_test_metrics(tiny_run_dir)["test/chrf"], abs=0.01
    )
    # Overrides still win: another split of the same data.
    val = evaluate(tmp_path, f"ckpt_path={lone}", "split=validation", "data.sizes.validation=40")
    assert val["data"]["split"] == "validation" and val["n_sentences"] == 40


def test_data_from_overrides_and_files(tiny_run_dir: Path, tmp_path: Path) -> None:
    """Without a stored data config: `data=numbers ...` overrides, or plain files."""
    ckpt = load_checkpoint(best_checkpoint(tiny_run_dir))
    ckpt["transformer_mt"]["data"] = None  # as written by a tool that stores no data config
    lone = save_checkpoint(ckpt, tmp_path / "alone" / "model.ckpt")
    with pytest.raises(DataMismatchError, match="stores no data config"):
        evaluate(tmp_path, f"ckpt_path={lone}")
    results = evaluate(tmp_path, f"ckpt_path={lone}", "data=numbers", *DATA_OVERRIDES)
    assert results["data"]["origin"] == "overrides"
    assert results["metrics"]["chrf"] == pytest.approx(
        trainer_test_metrics(tiny_run_dir)["test/chrf"], abs=0.01
    )
    # A test set in the Multi30k files layout, chosen by data.prefixes.test=...
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for prefix in ("train", "val", "test_2017_flickr"):
        (corpus / f"{prefix}.en").write_text("Anna has two apples.\nTom saw a car.\n")
        (corpus / f"{prefix}.de").write_text("Anna hat zwei Äpfel.\nTom hat ein Auto gesehen.\n")
    files = evaluate(
        tmp_path,
        f"ckpt_path={lone}",
        "data=files",
        f"data.dir={corpus}",
        "data.file_format=parallel",
        "data.cache_dir=null",
        "data.num_workers=0",
        "data.prefixes.test=test_2017_flickr",
    )
    assert files["n_sentences"] == 2
    plain = evaluate(
        tmp_path,
        f"ckpt_path={lone}",
        f"source_file={corpus / 'test_2017_flickr.en'}",
        f"reference_file={corpus / 'test_2017_flickr.de'}",
    )
    assert plain["metrics"]["chrf"] == pytest.approx(files["metrics"]["chrf"], abs=0.01)


def test_language_mismatch(tiny_run_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(DataMismatchError, match=r"translates en->de but the data is de->en"):
        evaluate(
            tmp_path,
            f"ckpt_path={best_checkpoint(tiny_run_dir)}",
            "data.src_lang=de",
            "data.tgt_lang=en",
        )


def test_missing_checkpoint_and_path(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="no checkpoint given"):
        evaluate(tmp_path)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        evaluate(tmp_path, f"ckpt_path={tmp_path / 'nope.ckpt'}")


def test_cli_error_is_one_line_without_traceback(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    env["OMP_NUM_THREADS"] = "1"
    bad = tmp_path / "model.ckpt"
    bad.write_text("not a checkpoint\n")
    proc = subprocess.run(
        [sys.executable, "evaluate.py", f"ckpt_path={bad}", f"hydra.run.dir={tmp_path / 'out'}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and "not a PyTorch checkpoint" in errors[0], proc.stderr


def test_checkpoint_holds_plain_tensors_and_languages(tiny_run_dir: Path) -> None:
    """Sanity check of the fixture: the checkpoint holds a usable model and tokenizer."""
    ckpt = load_checkpoint(best_checkpoint(tiny_run_dir))
    assert ckpt["transformer_mt"]["src_lang"] == "en"
    assert all(torch.is_tensor(v) for v in ckpt["state_dict"].values())


def test_a_decoding_sweep_ranks_settings_and_its_best_is_reused(
    tiny_run_dir: Path, tmp_path: Path
) -> None:
    """evaluate.py -m over beam sizes on the validation split: a summary best first, and a
    best_decoding.yaml that evaluate.py (decoding_from=) and translate (--decoding-from) read."""
    ckpt = best_checkpoint(tiny_run_dir)
    sweep_dir = tmp_path / "decoding"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("HYDRA_FULL_ERROR", None)
    command = [sys.executable, "evaluate.py", "-m", f"ckpt_path={ckpt}", "split=validation"]
    command += ["progress=false", "decoding.beam_size=1,3", f"hydra.sweep.dir={sweep_dir}"]
    proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(sweep_dir / "summary.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert sorted(r["decoding.beam_size"] for r in rows) == ["1", "3"]
    bleus = [float(r["metrics.bleu"]) for r in rows]
    assert bleus == sorted(bleus, reverse=True)  # best first
    best = OmegaConf.load(sweep_dir / "best_decoding.yaml")
    assert best.decoding.beam_size == int(rows[0]["decoding.beam_size"])
    assert best["metrics.bleu"] == pytest.approx(bleus[0])

    # Reused without retyping: evaluate on the sweep directory, translate on the file.
    results = evaluate(
        tmp_path / "again", f"ckpt_path={ckpt}", f"decoding_from={sweep_dir}", "split=validation"
    )
    assert results["decoding"]["beam_size"] == best.decoding.beam_size
    assert results["metrics"]["bleu"] == pytest.approx(bleus[0])
    override = evaluate(
        tmp_path / "over", f"ckpt_path={ckpt}", f"decoding_from={sweep_dir}", "decoding.beam_size=2"
    )
    assert override["decoding"]["beam_size"] == 2  # an explicit decoding.* wins
    from transformer_mt.cli.translate import build_parser
    from transformer_mt.inference.translator import decoding_from

    args = build_parser().parse_args(
        ["--ckpt", str(ckpt), "--decoding-from", str(sweep_dir / "best_decoding.yaml")]
    )
    assert decoding_from(args.decoding_from)["beam_size"] == best.decoding.beam_size
    with pytest.raises(FileNotFoundError, match=r"best_decoding\.yaml of a decoding sweep"):
        decoding_from(tmp_path / "nothing.yaml")


def test_steered_evaluation_samples_forces_constrains_and_aligns(
    tiny_run_dir: Path, tmp_path: Path
) -> None:
    """decoding.sampling_* sample, prefix_file and constraints_file steer each test sentence,
    alignments=true writes one Pharaoh line per sentence."""
    ckpt = f"ckpt_path={best_checkpoint(tiny_run_dir)}"
    sampled = [
        evaluate(tmp_path / f"s{i}", ckpt, "decoding.sampling_topk=10", f"decoding.seed={seed}")
        for i, seed in enumerate((5, 5, 6))
    ]
    texts = [Path(r["hypotheses_path"]).read_text(encoding="utf-8") for r in sampled]
    assert texts[0] == texts[1] != texts[2]
    assert (
        sampled[0]["decoding"]["sampling_topk"] == 10 and sampled[0]["decoding"]["beam_size"] == 1
    )
    n = sampled[0]["n_sentences"]
    prefix_file, constraints_file = tmp_path / "prefixes.txt", tmp_path / "constraints.jsonl"
    prefix_file.write_text("Ich\n" * n, encoding="utf-8")
    constraints_file.write_text('["Katzen"]\n' * n, encoding="utf-8")
    results = evaluate(
        tmp_path / "steer", ckpt, f"prefix_file={prefix_file}",
        f"constraints_file={constraints_file}", "decoding.beam_size=3", "alignments=true",
    )  # fmt: skip
    hyps = Path(results["hypotheses_path"]).read_text(encoding="utf-8").splitlines()
    assert len(hyps) == n and all(h.startswith("Ich") and "Katzen" in h for h in hyps)
    links = Path(results["alignments_path"]).read_text(encoding="utf-8").splitlines()
    assert len(links) == n
    for line, hyp in zip(links, hyps):
        assert sorted(int(p.split("-")[1]) for p in line.split()) == list(range(len(hyp.split())))
