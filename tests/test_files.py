"""The one atomic writer: a crash mid-write leaves the old file and no debris."""

from __future__ import annotations

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
