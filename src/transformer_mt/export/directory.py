"""Export directories: refused before any work when an export would destroy them, written
beside their place and renamed into it when complete.

``--force`` replaces a previous export only (recognised by its :data:`MARKER` file), never an
arbitrary directory; no output may be, contain or lie inside an input.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from transformer_mt.errors import ExportError
from transformer_mt.files import check_output_parent, check_outputs_apart, write_text_atomic

#: Written last into every export: ``--force`` replaces a directory only if it holds one.
MARKER = ".transformer-mt-export"


@contextlib.contextmanager
def staging(out_dir: Path, fmt: str) -> Iterator[Path]:
    """A fresh sibling directory (``mkdtemp``: nothing is removed to make room) that replaces
    ``out_dir``, checked by :func:`check_out_dir`, when the block succeeds."""
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = _fresh_sibling(out_dir, ".partial")
    try:
        yield tmp
        write_text_atomic(tmp / MARKER, json.dumps({"format": fmt}) + "\n")
        _readable_by_all(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if not out_dir.exists():
        tmp.rename(out_dir)
        return
    # rename() replaces an empty directory: the reserved name takes the previous export.
    old = _fresh_sibling(out_dir, ".old")
    os.replace(out_dir, old)
    tmp.rename(out_dir)
    shutil.rmtree(old, ignore_errors=True)


def _fresh_sibling(out_dir: Path, suffix: str) -> Path:
    """A new empty directory beside ``out_dir`` with the permissions ``mkdir`` would give."""
    path = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", suffix=suffix, dir=out_dir.parent))
    umask = os.umask(0)
    os.umask(umask)
    path.chmod(0o777 & ~umask)  # mkdtemp's 0700 would make the export private
    return path


def _readable_by_all(directory: Path) -> None:
    """Give every file the mode a plain ``open()`` would (0644 under umask 022): some writers
    make owner-only files, and an exported model is meant to be shared."""
    umask = os.umask(0)
    os.umask(umask)
    directory.chmod(0o777 & ~umask)
    for path in directory.rglob("*"):
        path.chmod((0o777 if path.is_dir() else 0o666) & ~umask)


def check_out_dir(out_dir: Path, force: bool, inputs: Sequence[tuple[str, Any]] = ()) -> None:
    """Refuse, before any work, an ``--out`` that an export would destroy or cannot write.

    ``--force`` replaces a previous export only (recognised by its :data:`MARKER` file), never
    an arbitrary directory, and no output may be, contain or lie inside an input.
    """
    check_outputs_apart([("--out", out_dir)], inputs)
    if out_dir.exists() and not out_dir.is_dir():
        raise ExportError(f"--out {out_dir} is a file; pass a directory path")
    check_output_parent(out_dir, "--out")
    if not out_dir.is_dir() or not any(out_dir.iterdir()):
        return
    if not force:
        raise ExportError(
            f"--out {out_dir} exists and is not empty; pass --force to replace a previous "
            "export there, or choose another directory"
        )
    if not (out_dir / MARKER).is_file():
        raise ExportError(
            f"--out {out_dir} is not a previous export (it has no {MARKER} file), so --force "
            "does not replace it; choose another directory, or empty this one yourself"
        )
