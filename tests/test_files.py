"""The one atomic writer: a crash mid-write leaves the old file and no debris."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from transformer_mt.files import atomic_write, write_text_atomic


def test_replaces_the_file_and_leaves_no_temp(tmp_path: Path) -> None:
    target = tmp_path / "sub" / "out.json"
    write_text_atomic(target, "old")
    write_text_atomic(target, "new ü")
    assert target.read_text(encoding="utf-8") == "new ü"
    assert sorted(p.name for p in target.parent.iterdir()) == ["out.json"]


def test_an_error_mid_write_keeps_the_old_file_and_removes_the_temp(tmp_path: Path) -> None:
    target = tmp_path / "model.ckpt"
    target.write_bytes(b"complete old checkpoint")
    with pytest.raises(RuntimeError, match="disk full"), atomic_write(target) as handle:
        handle.write(b"half of a new one")
        raise RuntimeError("disk full")
    assert target.read_bytes() == b"complete old checkpoint"
    assert [p.name for p in tmp_path.iterdir()] == ["model.ckpt"]


def test_rejects_append_mode(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="mode must be"), atomic_write(tmp_path / "x", "a"):
        pass


# ------------------------------------------------------------------ input text, one way


def test_decode_lines_splits_on_newline_only_and_strips_the_ending() -> None:
    from transformer_mt.files import decode_lines

    raw = [b"one\r\n", "zwei \u2028 drei\n".encode(), b"last"]
    assert list(decode_lines(raw, "in.txt")) == ["one", "zwei \u2028 drei", "last"]


def test_decode_lines_refuses_bad_bytes_with_file_line_and_the_opt_in() -> None:
    from transformer_mt.files import decode_lines

    raw = [b"fine\n", b"caf\xe9\n"]
    with pytest.raises(ValueError) as err:
        list(decode_lines(raw, "in.de", fix="--errors replace"))
    assert str(err.value) == (
        "in.de, line 2: not valid UTF-8 (invalid continuation byte at byte 3 of the line); "
        "convert the file to UTF-8, e.g. with iconv -f latin1 -t utf-8, or pass --errors "
        "replace to read such bytes as U+FFFD"
    )


def test_decode_lines_replace_counts_the_lines() -> None:
    from transformer_mt.files import decode_lines, replaced_lines_warning

    replaced: list[int] = []
    raw = [b"caf\xe9\n", b"ok\n", b"\xff\xfe\n"]
    lines = list(decode_lines(raw, "in.de", errors="replace", replaced=replaced))
    assert lines == ["caf\ufffd", "ok", "\ufffd\ufffd"]
    assert replaced == [1, 3]
    assert replaced_lines_warning("in.de", replaced).startswith(
        "in.de: 2 line(s) are not valid UTF-8 and were read with U+FFFD replacement "
        "characters (lines 1, 3)"
    )
    assert replaced_lines_warning("in.de", []) == ""


def test_read_lines_names_what_is_missing(tmp_path: Path) -> None:
    from transformer_mt.files import read_lines

    with pytest.raises(FileNotFoundError, match=r"^source_file .*nope does not exist; check"):
        read_lines(tmp_path / "nope", "source_file")
    with pytest.raises(IsADirectoryError, match=r"^source_file .* is a directory; pass a text"):
        read_lines(tmp_path, "source_file")
    (tmp_path / "ok.txt").write_bytes(b"a\nb\n")
    assert read_lines(tmp_path / "ok.txt", "source_file") == (["a", "b"], [])


# ------------------------------------------------------------------ outputs never overlap inputs


@pytest.mark.parametrize(
    ("output", "relation"),
    [
        ("run/checkpoints/best.ckpt", "is"),
        ("run/checkpoints", "contains"),
        ("run", "contains"),
        ("model/sub/out.txt", "lies inside"),
    ],
)
def test_an_output_that_is_contains_or_lies_inside_an_input_is_refused(
    tmp_path: Path, output: str, relation: str
) -> None:
    from transformer_mt.files import check_outputs_apart

    ckpt = tmp_path / "run" / "checkpoints" / "best.ckpt"
    ckpt.parent.mkdir(parents=True)
    ckpt.write_bytes(b"weights")
    (tmp_path / "model").mkdir()
    inputs = [("--ckpt", ckpt), ("--ct2-model", tmp_path / "model")]
    out = tmp_path / output
    with pytest.raises(ValueError) as err:
        check_outputs_apart([("--out", out)], inputs)
    assert f"--out {out} {relation} the " in str(err.value)
    assert str(err.value).endswith("writing it would destroy the input; choose another --out")
    check_outputs_apart([("--out", tmp_path / "elsewhere")], inputs)  # no error


def test_the_same_file_under_another_name_is_refused(tmp_path: Path) -> None:
    from transformer_mt.files import check_outputs_apart

    (tmp_path / "in.de").write_text("x\n")
    os.link(tmp_path / "in.de", tmp_path / "hard.de")
    (tmp_path / "sym.de").symlink_to(tmp_path / "in.de")
    for name in ("hard.de", "sym.de", "./sub/../in.de"):
        (tmp_path / "sub").mkdir(exist_ok=True)
        with pytest.raises(ValueError, match="is the --input"):
            check_outputs_apart([("-o", tmp_path / name)], [("--input", tmp_path / "in.de")])
    with pytest.raises(ValueError, match="are the same file"):
        check_outputs_apart([("a", tmp_path / "x"), ("b", tmp_path / "x")], [])
    check_outputs_apart([("-o", "-")], [("--input", "-")])  # stdin and stdout


def test_an_output_below_a_regular_file_or_on_a_directory_is_refused(tmp_path: Path) -> None:
    from transformer_mt.files import check_output_file

    (tmp_path / "file").write_text("x")
    with pytest.raises(NotADirectoryError) as err:
        check_output_file(tmp_path / "file" / "sub" / "out.txt", "-o")
    assert str(err.value) == (
        f"-o {tmp_path}/file/sub/out.txt lies below {tmp_path}/file, which is a file, not a "
        "directory; choose another path"
    )
    with pytest.raises(IsADirectoryError, match="is a directory; give a file path"):
        check_output_file(tmp_path, "-o")
    check_output_file(tmp_path / "new" / "out.txt", "-o")  # a missing directory is created later


# --------------------------------------------------- outputs that are not plain files


def test_a_symlinked_output_keeps_the_link_and_replaces_its_file(tmp_path: Path) -> None:
    real = tmp_path / "real.txt"
    real.write_text("old\n")
    link = tmp_path / "link.txt"
    link.symlink_to(real)
    with atomic_write(link, "w") as handle:
        handle.write("new\n")
    assert link.is_symlink() and real.read_text() == "new\n"


def test_a_named_pipe_is_written_through_not_replaced(tmp_path: Path) -> None:
    import threading

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()))
    reader.start()
    with atomic_write(fifo, "wb") as handle:
        handle.write(b"through\n")
    reader.join(timeout=30)
    assert got == [b"through\n"]
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
def test_a_full_device_is_an_error_and_stays_a_device() -> None:
    with pytest.raises(OSError), atomic_write("/dev/full", "w") as handle:
        handle.write("x" * 100_000)
    assert stat.S_ISCHR(os.stat("/dev/full").st_mode)
