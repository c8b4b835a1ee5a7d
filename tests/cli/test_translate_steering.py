"""translate's steering: seeded sampling, --prefix-file, --constraints-file, --alignments."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from transformer_mt.cli.translate import main

from conftest import best_checkpoint, train_tiny_run

LINES = [
    "I know that Anna has four hundred and ninety-seven apples.",
    "There are twelve cats in the garden.",
    "",
    "Peter bought three books yesterday.",
]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return best_checkpoint(train_tiny_run(tmp_path_factory.getbasetemp() / "tiny_run"))


def _run(ckpt: Path, tmp_path: Path, *args: str, lines: list[str] = LINES) -> list[str]:
    src, out = tmp_path / "in.en", tmp_path / "out.txt"
    src.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    assert main(["--ckpt", str(ckpt), "-i", str(src), "-o", str(out), "-q", *args]) == 0
    return out.read_text(encoding="utf-8").split("\n")[:-1]


def _file(tmp_path: Path, name: str, lines: list[str]) -> str:
    path = tmp_path / name
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return str(path)


def test_seeded_samples_repeat_and_change_with_the_seed(ckpt: Path, tmp_path: Path) -> None:
    sample = ("--sampling-topk", "20", "--temperature", "1.5", "--nbest", "3")
    first = _run(ckpt, tmp_path, *sample, "--seed", "3")
    assert first == _run(ckpt, tmp_path, *sample, "--seed", "3")
    assert first != _run(ckpt, tmp_path, *sample, "--seed", "4")
    # Three samples a line (an empty line: one empty output, as for n-best lists).
    assert len(first) == 3 * len([line for line in LINES if line]) + 1
    # One line alone draws what it drew beside the others.
    alone = _run(ckpt, tmp_path, *sample, "--seed", "3", lines=LINES[1:2])
    assert [line.split("\t", 1)[1] for line in alone] == [
        line.split("\t", 1)[1] for line in first if line.startswith("1\t")
    ]


def test_every_output_starts_with_its_prefix(ckpt: Path, tmp_path: Path) -> None:
    prefixes = ["Ich glaube, dass", "Im Garten", "", "Gestern"]
    for beam in ("1", "4"):
        out = _run(ckpt, tmp_path, "--beam-size", beam, "--prefix-file",
                   _file(tmp_path, "p.de", prefixes))  # fmt: skip
        for prefix, text, line in zip(prefixes, out, LINES):
            assert text.startswith(prefix) if line else text == ""


def test_every_output_contains_its_constraints(ckpt: Path, tmp_path: Path) -> None:
    constraints = [["Katzen"], ["im Haus", "Hunde"], [], ["Peter", "gestern"]]
    path = _file(tmp_path, "c.jsonl", [json.dumps(c) for c in constraints])
    out = _run(ckpt, tmp_path, "--beam-size", "5", "--nbest", "3", "--constraints-file", path)
    for line in out:
        index, _, _, text = line.split("\t")
        if LINES[int(index)]:
            assert all(phrase in text for phrase in constraints[int(index)]), line


def test_alignments_are_pharaoh_pairs_within_both_sentences(ckpt: Path, tmp_path: Path) -> None:
    records = [json.loads(r) for r in _run(ckpt, tmp_path, "--alignments", "--format", "jsonl")]
    for record, line in zip(records, LINES):
        hyp = record["hypotheses"][0]
        pairs = [tuple(map(int, p.split("-"))) for p in hyp["alignment"].split()]
        n_src, n_out = len(line.split()), len(hyp["text"].split())
        assert all(0 <= i < n_src and 0 <= j < n_out for i, j in pairs)
        # One link per output word.
        assert sorted(j for _, j in pairs) == list(range(n_out))
    text = _run(ckpt, tmp_path, "--alignments")
    assert all(line.count("\t") == 1 for line in text)


@pytest.mark.parametrize(
    "args, words",
    [
        (["--sampling-topp", "1.5"], "--sampling-topp"),
        (["--sampling-topk", "5", "--beam-size", "4"], "--beam-size 1"),
        (["--temperature", "2"], "--sampling-topk 0"),
        (["--seed", "1"], "only applies to sampling"),
        (["--length-penalty", "nan"], "--length-penalty 0.6"),
        (["--engine", "ctranslate2", "--constraints-file", "c.jsonl"], "--engine torch"),
        (["--sampling-topk", "5", "--constraints-file", "c.jsonl"], "--beam-size 5"),
    ],
)
def test_bad_steering_is_one_line(ckpt, tmp_path, capsys, args, words) -> None:
    _file(tmp_path, "c.jsonl", ["[]"] * len(LINES))
    args = [str(tmp_path / a) if a == "c.jsonl" else a for a in args]
    src = _file(tmp_path, "in.en", LINES)
    assert main(["--ckpt", str(ckpt), "-i", src, "-o", str(tmp_path / "o"), *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and words in err[0], err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    "name, lines, words",
    [
        ("p.de", ["a", "b"], "has 2 lines but the input has 4"),
        ("c.jsonl", ["[]", "not json", "[]", "[]"], "line 2 is not a JSON list"),
        ("c.jsonl", ["[]", '[""]', "[]", "[]"], "line 2 is not a JSON list"),
    ],
)
def test_bad_steering_files_are_refused_before_any_output(
    ckpt, tmp_path, capsys, name, lines, words
) -> None:
    flag = "--prefix-file" if name == "p.de" else "--constraints-file"
    src, out = _file(tmp_path, "in.en", LINES), tmp_path / "o"
    code = main(
        ["--ckpt", str(ckpt), "-i", src, "-o", str(out), flag, _file(tmp_path, name, lines)]
    )
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and words in err and "\n" not in err
    assert not out.exists()
