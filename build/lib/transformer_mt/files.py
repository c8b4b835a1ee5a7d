"""The one way the project writes a file that a crash could tear.

:func:`atomic_write` opens a temporary file in the target's own directory, hands it to the
caller, then flushes, ``fsync``-s and renames it over the target, and finally ``fsync``-s the
directory so that the rename itself is durable. A reader (a resuming run, ``evaluate.py``, a
sweep summary being refreshed) therefore sees the old complete file or the new complete file,
never half of one, whenever the process is killed or the disk fills up. On any failure the
temporary file is removed and the target is left as it was.

Checkpoints, averaged checkpoints, tokenizers and sweep results all go through here. This
module sits at the bottom of the package (beside :mod:`transformer_mt.cli`): it imports
nothing of the project, so every wing may use it.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

#: Suffix of the temporary file written before the rename (``.<name>.<pid>.tmp``).
TMP_SUFFIX = ".tmp"


def temporary_path(target: Path) -> Path:
    """The hidden temp file :func:`atomic_write` uses for ``target`` (same directory)."""
    return target.with_name(f".{target.name}.{os.getpid()}{TMP_SUFFIX}")


@contextlib.contextmanager
def atomic_write(
    path: str | os.PathLike[str], mode: str = "wb", **open_kwargs: Any
) -> Iterator[IO[Any]]:
    """Open ``path`` for writing so that it is replaced atomically and durably.

    Example::

        with atomic_write(run_dir / "tokenizer.json", "w", encoding="utf-8") as f:
            f.write(text)

    Args:
        path: the file to create or replace; its parent directory is created if missing.
        mode: ``"wb"`` (default) or ``"w"``; appending makes no sense for a replace.
        **open_kwargs: passed to :func:`open` (``encoding=...`` for text).
    """
    if "a" in mode or "r" in mode:
        raise ValueError(
            f"atomic_write replaces a whole file; mode must be 'w' or 'wb', got {mode!r}"
        )
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_path(target)
    try:
        with open(tmp, mode, **open_kwargs) as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_directory(target.parent)


def write_text_atomic(path: str | os.PathLike[str], text: str) -> None:
    """Replace ``path`` with ``text`` (UTF-8) through :func:`atomic_write`."""
    with atomic_write(path, "w", encoding="utf-8") as handle:
        handle.write(text)


def fsync_directory(directory: Path) -> None:
    """Persist a rename inside ``directory`` (POSIX); a no-op where directories cannot be opened."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
