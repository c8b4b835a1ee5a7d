"""The teacher's translations for distillation (inference/distill.py): one line per source,
kept per teacher, settings and data, reused, resumed shard by shard after an interruption,
and never written into a folder another teacher's decode made."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from transformer_mt.inference.distill import TEACHER_FILE, distil

SOURCES = [f"sentence {i}" for i in range(7)]
TEACHER = {"checkpoints": [{"path": "/a/t.ckpt", "sha256": "ab" * 32}], "decoding": {"beam": 5}}


class Teacher:
    """Upper-cases its input; fails at the ``fail_at``-th call (an interruption)."""

    def __init__(self, fail_at: int | None = None) -> None:
        self.calls: list[list[str]] = []
        self.fail_at = fail_at

    def translate(self, lines: list[str]) -> list[str]:
        self.calls.append(list(lines))
        if self.fail_at is not None and len(self.calls) == self.fail_at:
            raise KeyboardInterrupt
        return [line.upper() for line in lines]


def test_one_translation_per_source_kept_with_its_teacher_and_reused(tmp_path: Path) -> None:
    teacher = Teacher()
    path, made = distil(SOURCES, TEACHER, lambda: teacher, tmp_path, shard_size=3)
    assert path.read_text(encoding="utf-8").splitlines() == [s.upper() for s in SOURCES]
    assert [len(c) for c in teacher.calls] == [3, 3, 1]
    record = json.loads((path.parent / TEACHER_FILE).read_text(encoding="utf-8"))
    assert record["checkpoints"] == TEACHER["checkpoints"] and record["sources"]["count"] == 7
    assert made["decode"]["sentences"] == 7 and not made["decode"]["resumed"]
    assert sorted(p.name for p in path.parent.iterdir()) == ["targets.txt", "teacher.json"]

    def never() -> Teacher:
        raise AssertionError("the kept translations are decoded again")

    # The same teacher's bytes at another path, the same settings and sources: reused.
    moved = {**TEACHER, "checkpoints": [{"path": "/b/t.ckpt", "sha256": "ab" * 32}]}
    assert distil(SOURCES, moved, never, tmp_path, shard_size=3)[0] == path
    # Another teacher, other settings or other sources: a folder of their own.
    other = {**TEACHER, "checkpoints": [{"path": "/a/t.ckpt", "sha256": "cd" * 32}]}
    assert distil(SOURCES, other, Teacher, tmp_path, shard_size=3)[0] != path
    assert distil(SOURCES, {**TEACHER, "decoding": {"beam": 1}}, Teacher, tmp_path)[0] != path
    assert distil(SOURCES[:6], TEACHER, Teacher, tmp_path, shard_size=3)[0] != path


def test_an_interrupted_decode_resumes_at_the_first_missing_shard(tmp_path: Path) -> None:
    first = Teacher(fail_at=2)
    with pytest.raises(KeyboardInterrupt):
        distil(SOURCES, TEACHER, lambda: first, tmp_path, shard_size=3)
    [folder] = tmp_path.iterdir()
    assert sorted(p.name for p in folder.iterdir()) == ["shard-00000.txt", "teacher.json"]
    second = Teacher()
    path, made = distil(SOURCES, TEACHER, lambda: second, tmp_path, shard_size=3)
    assert second.calls == [SOURCES[3:6], SOURCES[6:]]  # the finished shard is not redone
    assert path.read_text(encoding="utf-8").splitlines() == [s.upper() for s in SOURCES]
    assert made["decode"]["resumed"] and made["decode"]["sentences"] == 4


def test_a_folder_another_teacher_made_is_never_written_into(tmp_path: Path) -> None:
    path, _ = distil(SOURCES, TEACHER, Teacher, tmp_path)
    record = path.parent / TEACHER_FILE
    record.write_text(json.dumps({**TEACHER, "decoding": {"beam": 9}}), encoding="utf-8")
    path.unlink()  # even with its translations gone, the folder is not this teacher's
    with pytest.raises(ValueError, match="holds files this teacher did not make"):
        distil(SOURCES, TEACHER, Teacher, tmp_path)
    assert not path.exists()
    record.unlink()  # a folder with no record at all is not ours either
    with pytest.raises(ValueError, match="did not make"):
        distil(SOURCES, TEACHER, Teacher, tmp_path)
