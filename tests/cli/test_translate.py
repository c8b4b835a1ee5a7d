"""The translate command: one line out per line in, in order; odd input; greedy vs beam."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from transformer_mt.checkpoint import load_model
from transformer_mt.cli.translate import main
from transformer_mt.inference.search import SearchConfig
from transformer_mt.inference.translator import Translator

from conftest import ROOT, best_checkpoint, train_tiny_run


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return best_checkpoint(train_tiny_run(tmp_path_factory.getbasetemp() / "tiny_run"))


def translate_file(ckpt: Path, tmp_path: Path, lines: list[str], *args: str) -> list[str]:
    src, out = tmp_path / "in.txt", tmp_path / "out.txt"
    src.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    assert main(["--ckpt", str(ckpt), "-i", str(src), "-o", str(out), *args]) == 0
    text = out.read_text(encoding="utf-8")
    assert text.endswith("\n") or not lines
    return text.split("\n")[:-1]


def test_line_count_order_and_empty_lines(ckpt: Path, tmp_path: Path) -> None:
    lines = [
        "Anna has two apples.",
        "",
        "   \t ",
        "I know that Tom has ninety-seven cars.",
        "Anna has two apples.",
        "a\rb\u2028c",  # characters some readers treat as line breaks
    ]
    out = translate_file(ckpt, tmp_path, lines, "--batch-size", "2")
    assert len(out) == len(lines)
    assert out[1] == "" and out[2] == ""
    assert out[0] == out[4]  # same sentence, same output, wherever its batch
    # Order is kept: translating each line alone gives the same lines.
    alone = [translate_file(ckpt, tmp_path, [line])[0] for line in lines[:4]]
    assert out[:4] == alone


def test_unicode_and_long_lines(
    ckpt: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    lines = ["I ❤️ 🍎🍏 apples 😀", "日本語のテキスト、中文字符", "x" * 10_000, "é" * 3000 + " Ω"]
    with caplog.at_level("WARNING"):
        out = translate_file(ckpt, tmp_path, lines, "--greedy")
    assert len(out) == len(lines)
    assert any("truncated" in r.getMessage() for r in caplog.records)


def test_stdin_stdout_subprocess(ckpt: Path) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    text = "Anna has two apples.\n\n😀 漢字\n"
    proc = subprocess.run(
        [sys.executable, "scripts/translate.py", "--ckpt", str(ckpt), "--beam-size", "2"],
        input=text.encode(),
        capture_output=True,
        cwd=ROOT,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr.decode()
    out = proc.stdout.decode("utf-8").split("\n")
    assert len(out) == 4 and out[1] == "" and out[3] == ""


def test_beam_at_least_as_good_as_greedy_by_model_log_prob(ckpt: Path) -> None:
    """Beam search (alpha 0: ranks by raw log-probability) finds outputs the model scores at
    least as high as greedy's, summed over sentences (BLEU is ~0 for a seconds-trained model)."""
    loaded = load_model(ckpt)
    sentences = [f"Anna has {n} apples." for n in ("two", "ninety-seven", "four hundred")]
    sentences += ["I know that Tom bought three cars.", "There are five boats in the shop."]
    greedy = Translator(loaded, SearchConfig(beam_size=1, max_len_b=10))
    beam = Translator(loaded, SearchConfig(beam_size=4, length_penalty=0.0, max_len_b=10))
    src = greedy.encode(sentences)
    g_scores = greedy.log_probs(src, greedy.translate_ids(src))
    b_scores = beam.log_probs(src, beam.translate_ids(src))
    assert sum(b_scores) >= sum(g_scores) - 1e-4
    assert sum(b > g - 1e-4 for b, g in zip(b_scores, g_scores)) >= len(sentences) - 1


def test_errors_are_one_line(ckpt: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["--ckpt", str(tmp_path / "missing.ckpt")]) == 2
    err = capsys.readouterr().err.strip()
    assert "does not exist" in err and len(err.splitlines()) == 1
    assert main(["--ckpt", str(ckpt), "--beam-size", "0"]) == 2
    assert "beam_size must be >= 1, got 0; set --beam-size 1 (greedy)" in capsys.readouterr().err
    # A deleted flag (the compiled decoding step) is refused by the parser, in one line.
    with pytest.raises(SystemExit) as exited:
        main(["--ckpt", str(ckpt), "--compile"])
    assert exited.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err == "error: unrecognized arguments: --compile; see transformer-mt-translate --help"


def test_output_over_the_input_is_refused_and_the_input_kept(
    ckpt: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    src = tmp_path / "f.de"
    src.write_text("Anna has two apples.\n", encoding="utf-8")
    assert main(["--ckpt", str(ckpt), "-i", str(src), "-o", str(src)]) == 2
    assert capsys.readouterr().err == (
        f"error: --output {src} is the --input {src}: writing it would destroy the input; "
        "choose another --output\n"
    )
    assert src.read_text(encoding="utf-8") == "Anna has two apples.\n"


def test_input_that_is_not_utf8_is_refused_or_replaced_on_request(
    ckpt: Path, tmp_path: Path, capsys: pytest.CaptureFixture, caplog: pytest.LogCaptureFixture
) -> None:
    src, out = tmp_path / "latin1.de", tmp_path / "out.txt"
    src.write_bytes("Anna hat zwei Äpfel.\nTom hat drei.\n".encode("latin-1"))
    out.write_text("an earlier translation\n")
    assert main(["--ckpt", str(ckpt), "-i", str(src), "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(
        f"error: {src}, line 1: not valid UTF-8 (invalid continuation byte at byte 14"
    )
    assert out.read_text() == "an earlier translation\n"  # untouched by the failed run
    assert main(["--ckpt", str(ckpt), "-i", str(src), "-o", str(out), "--errors", "replace"]) == 0
    assert len(out.read_text(encoding="utf-8").splitlines()) == 2
    warned = [m for m in caplog.messages if "not valid UTF-8 and were read with U+FFFD" in m]
    assert warned == [
        f"{src}: 1 line(s) are not valid UTF-8 and were read with U+FFFD replacement characters "
        "(lines 1); scores and translations of these lines are not those of the intended text"
    ]


def test_help() -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full and /dev/null")
def test_devices_as_output_are_written_through_never_replaced(
    ckpt: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    src = tmp_path / "in.txt"
    src.write_text("Anna has two apples.\n", encoding="utf-8")
    assert main(["--ckpt", str(ckpt), "-i", str(src), "-o", "/dev/null"]) == 0
    assert main(["--ckpt", str(ckpt), "-i", str(src), "-o", "/dev/full"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and "No space left" in err[0], err
    for device in ("/dev/null", "/dev/full"):
        assert Path(device).is_char_device()


def test_a_bad_byte_in_streamed_input_says_how_many_lines_were_written(ckpt: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "transformer_mt.cli.translate", "--ckpt", str(ckpt),
         "--buffer-size", "1", "-q"],
        input=b"Anna has two apples.\n\xff bad\n", capture_output=True, cwd=ROOT, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 2
    assert proc.stdout.decode().count("\n") == 1
    err = proc.stderr.decode().strip().splitlines()
    assert len(err) == 1 and err[0].endswith("(1 line was translated and written before it)")
