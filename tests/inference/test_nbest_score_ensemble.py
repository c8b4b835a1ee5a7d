"""n-best lists, scoring given translations (forced decoding) and ensembles, on a tiny run.

The equalities that matter: the score of a beam-search output is the score the search reported
(alpha 0); an ensemble of a checkpoint with itself translates token for token like the
checkpoint; the first entry of an n-best list is the 1-best translation.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from transformer_mt.checkpoint import load_model
from transformer_mt.cli.score import main as score_main
from transformer_mt.cli.translate import main as translate_main
from transformer_mt.inference.search import SearchConfig
from transformer_mt.inference.translator import Translator

from conftest import FIXTURES, best_checkpoint, evaluate, train_tiny_run

FIXTURE_V1 = FIXTURES / "format_v1" / "model.ckpt"
LINES = [
    "Anna has two apples.",
    "",
    "I know that Tom has ninety-seven cars.",
    "There are five boats in the shop.",
]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return best_checkpoint(train_tiny_run(tmp_path_factory.getbasetemp() / "tiny_run"))


def run_translate(ckpts: list[Path], tmp_path: Path, *args: str) -> list[str]:
    src, out = tmp_path / "in.txt", tmp_path / "out.txt"
    src.write_text("".join(line + "\n" for line in LINES), encoding="utf-8")
    ckpt_args = [a for c in ckpts for a in ("--ckpt", str(c))]
    assert translate_main([*ckpt_args, "-i", str(src), "-o", str(out), *args]) == 0
    return out.read_text(encoding="utf-8").split("\n")[:-1]


def test_nbest_tsv_and_jsonl_agree_with_the_1best(ckpt: Path, tmp_path: Path) -> None:
    beam = ["--beam-size", "4", "--length-penalty", "0"]
    best = run_translate([ckpt], tmp_path, *beam)
    tsv = [line.split("\t") for line in run_translate([ckpt], tmp_path, *beam, "--nbest", "3")]
    assert [(int(i), int(r)) for i, r, _, _ in tsv] == [
        (i, r) for i in range(len(LINES)) for r in (1, 2, 3) if LINES[i] or r == 1
    ]  # an empty line has one (empty) hypothesis
    for i, line in enumerate(best):
        (top,) = [row for row in tsv if row[:2] == [str(i), "1"]]
        assert top[3] == line
        scores = [float(row[2]) for row in tsv if row[0] == str(i)]
        assert scores == sorted(scores, reverse=True)
    records = [
        json.loads(r)
        for r in run_translate([ckpt], tmp_path, *beam, "--nbest", "3", "--format", "jsonl")
    ]
    assert [r["index"] for r in records] == list(range(len(LINES)))
    assert [r["source"] for r in records] == LINES
    assert [r["hypotheses"][0]["text"] for r in records] == best
    assert [len(r["hypotheses"]) for r in records] == [3, 1, 3, 3]
    assert all(isinstance(t, str) for r in records for h in r["hypotheses"] for t in h["tokens"])


def test_nbest_larger_than_the_beam_is_one_line(
    ckpt: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    assert translate_main(["--ckpt", str(ckpt), "--beam-size", "2", "--nbest", "3"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: nbest=3 but a beam of 2") and len(err.splitlines()) == 1


@pytest.mark.parametrize("beam", ["1", "3"])
def test_ensemble_with_itself_translates_like_the_checkpoint(
    ckpt: Path, tmp_path: Path, beam: str
) -> None:
    alone = run_translate([ckpt], tmp_path, "--beam-size", beam, "--nbest", "1")
    pair = run_translate([ckpt, ckpt], tmp_path, "--beam-size", beam, "--nbest", "1")
    assert pair == alone


def test_ensemble_of_different_tokenizers_is_refused(
    ckpt: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    assert translate_main(["--ckpt", str(ckpt), "--ckpt", str(FIXTURE_V1)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "cannot decode together: their" in err and str(FIXTURE_V1) in err
    args = ["--ckpt", str(ckpt), "--ckpt", str(ckpt), "--engine", "ctranslate2"]
    assert translate_main(args) == 2
    assert "ctranslate2 engine decodes one checkpoint, got 2" in capsys.readouterr().err


def test_score_of_a_beam_output_is_the_score_the_search_reported(
    ckpt: Path, tmp_path: Path
) -> None:
    """Forced decoding gives the search's score (alpha 0: the log-probability) to 1e-4."""
    translator = Translator(load_model(ckpt), SearchConfig(beam_size=3, length_penalty=0.0))
    sources = [line for line in LINES if line]
    found = translator.translate_batch(sources)
    src, tgt = tmp_path / "src.txt", tmp_path / "tgt.txt"
    src.write_text("".join(s + "\n" for s in sources), encoding="utf-8")
    tgt.write_text("".join(t.text + "\n" for t in found), encoding="utf-8")
    out = tmp_path / "scores.tsv"
    args = ["--ckpt", str(ckpt), "--source", str(src), "--target", str(tgt), "-o", str(out)]
    assert score_main([*args, "--tokens"]) == 0
    rows = [line.split("\t") for line in out.read_text(encoding="utf-8").splitlines()]
    assert len(rows) == len(sources)
    same_tokens = 0
    for row, translation in zip(rows, found):
        total, n, mean, per_token, tokens = row
        assert int(n) == len(tokens.split())
        assert abs(float(mean) - float(total) / int(n)) < 1e-3
        assert abs(sum(map(float, per_token.split())) - float(total)) < 2e-3
        if int(n) != len(translation.hypotheses[0].tokens) + 1:
            # The text of a barely trained model's output can be a run of one piece
            # ("oooo...") that BPE segments otherwise when it reads the text again: another
            # token sequence, with another score.
            continue
        same_tokens += 1
        assert abs(float(total) - translation.score) < 1e-3  # printed to 4 decimals
    assert same_tokens >= 2, "too few outputs read back as the tokens the search made"
    # The library call, unrounded: equal to 1e-4.
    ids = translator.encode(sources)
    exact = translator.log_probs(ids, [hyps[0].tokens for hyps in translator.decode_ids(ids)])
    assert exact == pytest.approx([t.score for t in found], abs=1e-4)


def test_score_tsv_input_and_ensemble_with_itself(ckpt: Path, tmp_path: Path) -> None:
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("Anna has two apples.\tAnna hat zwei Äpfel.\n\tleer\n", encoding="utf-8")
    outs = []
    for ckpts in ([ckpt], [ckpt, ckpt]):
        out = tmp_path / f"scores{len(ckpts)}.tsv"
        ckpt_args = [a for c in ckpts for a in ("--ckpt", str(c))]
        assert score_main([*ckpt_args, "-i", str(pairs), "-o", str(out)]) == 0
        outs.append(out.read_text(encoding="utf-8"))
    assert outs[0] == outs[1] and len(outs[0].splitlines()) == 2


def test_score_errors_are_one_line(
    ckpt: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    src, tgt = tmp_path / "src.txt", tmp_path / "tgt.txt"
    src.write_text("a\nb\nc\n", encoding="utf-8")
    tgt.write_text("x\ny\n", encoding="utf-8")
    base = ["--ckpt", str(ckpt), "--source", str(src), "--target", str(tgt)]
    assert score_main(base) == 2
    err = capsys.readouterr().err.strip()
    assert "has 3 lines but --target" in err and "has 2" in err and len(err.splitlines()) == 1
    tgt.write_text("x\ny\n" + "sehr " * 400 + "\n", encoding="utf-8")
    assert score_main(base) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: pair 3 has") and "--truncate" in err
    assert len(err.splitlines()) == 1
    out = tmp_path / "cut.tsv"
    assert score_main([*base, "--truncate", "-o", str(out)]) == 0
    assert len(out.read_text(encoding="utf-8").splitlines()) == 3
    bad = tmp_path / "bad.tsv"
    bad.write_text("no tab here\n", encoding="utf-8")
    assert score_main(["--ckpt", str(ckpt), "-i", str(bad)]) == 2
    assert "line 1 has no tab" in capsys.readouterr().err


def test_score_reads_bytes_that_are_not_utf8_as_translate_does(
    ckpt: Path, tmp_path: Path, capsys: pytest.CaptureFixture, caplog: pytest.LogCaptureFixture
) -> None:
    """Refused with the line named, or read as U+FFFD under --errors replace (with a warning)."""
    src, tgt = tmp_path / "src.txt", tmp_path / "tgt.txt"
    src.write_bytes(b"Anna has two apples.\nTom has caf\xe9s.\n")
    tgt.write_text("Anna hat zwei \u00c4pfel.\nTom hat Caf\u00e9s.\n", encoding="utf-8")
    base = ["--ckpt", str(ckpt), "--source", str(src), "--target", str(tgt)]
    assert score_main(base) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"error: {src}, line 2: not valid UTF-8") and "--errors replace" in line
    out = tmp_path / "scores.tsv"
    assert score_main([*base, "--errors", "replace", "-o", str(out)]) == 0
    assert len(out.read_text(encoding="utf-8").splitlines()) == 2
    assert any(f"{src}: 1 line(s) are not valid UTF-8" in m for m in caplog.messages)


def test_evaluate_nbest_writes_the_list_and_the_oracle_bleu(ckpt: Path, tmp_path: Path) -> None:
    one = evaluate(tmp_path / "one", f"ckpt_path={ckpt}", "decoding.beam_size=4")
    four = evaluate(
        tmp_path / "four", f"ckpt_path={ckpt}", "decoding.beam_size=4", "decoding.nbest=4"
    )
    assert four["metrics"]["bleu"] == one["metrics"]["bleu"]  # the 1-best is unchanged
    assert four["metrics"]["oracle_bleu"] >= four["metrics"]["bleu"]
    lines = Path(four["nbest_path"]).read_text(encoding="utf-8").splitlines()
    hyps = Path(one["hypotheses_path"]).read_text(encoding="utf-8").splitlines()
    top = [line.split("\t")[3] for line in lines if line.split("\t")[1] == "1"]
    assert top == hyps
    pair = evaluate(tmp_path / "pair", f"ckpt_path=['{ckpt}','{ckpt}']", "decoding.beam_size=4")
    assert pair["metrics"] == one["metrics"]
    assert pair["checkpoint"]["ensemble"] == [str(ckpt), str(ckpt)]
