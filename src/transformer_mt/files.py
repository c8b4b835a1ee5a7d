"""The one way the project writes a file that a crash could tear.

:func:`atomic_write`: temp file in the target's directory, fsync, rename, fsync the directory,
so a reader sees the old or the new complete file whenever the process dies or the disk fills.
It also reads input text (one way for every command) and checks output paths. It imports
nothing of the project, so every wing may use it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import IO, Any

log = logging.getLogger(__name__)

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

    A symlink stays (the file it points at is replaced); a device or named pipe is written
    through. On failure the temp file is removed and the target left as it was.

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
    if target.exists() and not target.is_file() and not target.is_dir():
        # A device or a pipe (/dev/stdout, a FIFO): nothing to rename over.
        try:
            with open(target, mode, **open_kwargs) as handle:
                yield handle
        except OSError as err:
            raise _naming(err, path) from None
        return
    if target.is_symlink():
        # Replace the file the link names; the link itself is the user's and stays.
        target = Path(os.path.realpath(target))
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_path(target)
    try:
        with open(tmp, mode, **open_kwargs) as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, target)
    except OSError as err:
        tmp.unlink(missing_ok=True)
        raise _naming(err, path, tmp) from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_directory(target.parent)


def _naming(err: OSError, path: str | os.PathLike[str], tmp: Path | None = None) -> OSError:
    """``err`` naming the file the user asked for: a full disk on a write names no file, and a
    failed rename names the hidden temporary file (another file named stays)."""
    named = err.filename is not None and (tmp is None or Path(err.filename) != tmp)
    if err.errno is None or named:
        return err
    return OSError(err.errno, err.strerror, str(path))


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


# ----------------------------------------------------------------------------- input text

#: How undecodable input bytes are handled: refuse them (naming file and line) or read them as
#: U+FFFD with a warning that counts the lines.
TEXT_ERRORS = ("strict", "replace")


def decode_lines(
    raw_lines: Iterable[bytes],
    name: str,
    *,
    errors: str = "strict",
    replaced: list[int] | None = None,
    fix: str = "",
) -> Iterator[str]:
    """Decode a byte stream split on ``b"\\n"`` as UTF-8 lines without their line ending.

    Every command reads input this way, so one file never reads two ways; a stray ``\\r`` or
    U+2028 cannot add lines, so output stays line-aligned with input.

    Args:
        name: the file as the user typed it, for the message.
        errors: ``"strict"`` raises on the first bad line; ``"replace"`` reads bad bytes as
            U+FFFD and appends each such line number to ``replaced``.
        fix: the option that opts in to replacing, for the message (``--errors replace``).

    Raises:
        ValueError: ``<name>, line N: not valid UTF-8 (...); <fix>``.
    """
    if errors not in TEXT_ERRORS:
        raise ValueError(f"errors must be one of {', '.join(TEXT_ERRORS)}, got {errors!r}")
    for number, raw in enumerate(raw_lines, start=1):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as err:
            if errors == "strict":
                opt_in = f", or pass {fix} to read such bytes as U+FFFD" if fix else ""
                raise ValueError(
                    f"{name}, line {number}: not valid UTF-8 ({err.reason} at byte {err.start} "
                    f"of the line); convert the file to UTF-8, e.g. with iconv -f latin1 -t "
                    f"utf-8{opt_in}"
                ) from None
            text = raw.decode("utf-8", errors="replace")
            if replaced is not None:
                replaced.append(number)
        yield text.rstrip("\n").rstrip("\r")


def replaced_lines_warning(name: str, replaced: Sequence[int]) -> str:
    """The warning for lines read with U+FFFD replacements (empty when there were none)."""
    if not replaced:
        return ""
    shown = ", ".join(str(n) for n in replaced[:5]) + (", ..." if len(replaced) > 5 else "")
    return (
        f"{name}: {len(replaced)} line(s) are not valid UTF-8 and were read with U+FFFD "
        f"replacement characters (lines {shown}); scores and translations of these lines are "
        "not those of the intended text"
    )


def read_lines(
    path: str | os.PathLike[str], what: str, *, errors: str = "strict", fix: str = ""
) -> tuple[list[str], list[int]]:
    """All lines of a UTF-8 text file (see :func:`decode_lines`) and the replaced line numbers.

    Raises:
        FileNotFoundError, IsADirectoryError, PermissionError: one line naming ``what``.
        ValueError: a line that is not valid UTF-8 with ``errors="strict"``.
    """
    file = Path(path)
    if not file.exists():
        raise FileNotFoundError(f"{what} {file} does not exist; check the path")
    if file.is_dir():
        raise IsADirectoryError(f"{what} {file} is a directory; pass a text file")
    replaced: list[int] = []
    try:
        with open(file, "rb") as handle:
            lines = list(decode_lines(handle, str(file), errors=errors, replaced=replaced, fix=fix))
    except PermissionError:
        raise PermissionError(
            f"{what} {file} cannot be read (permission denied); fix its permissions"
        ) from None
    return lines, replaced


def read_text_lines(name: str, what: str, *, errors: str = "strict", fix: str = "") -> list[str]:
    """The lines of a text file, or of stdin for ``-``, read as every input is
    (:func:`decode_lines`); replaced lines are counted in one warning.

    ``fix``: how the calling command spells ``errors=replace``, for the strict error.
    """
    replaced: list[int] = []
    if name == "-":
        lines = list(
            decode_lines(sys.stdin.buffer, "stdin", errors=errors, replaced=replaced, fix=fix)
        )
    else:
        lines, replaced = read_lines(name, what, errors=errors, fix=fix)
    if warning := replaced_lines_warning(name, replaced):
        log.warning(warning)
    return lines


# ----------------------------------------------------------------------------- outputs


def _same(a: Path, b: Path) -> bool:
    if a.exists() and b.exists():
        return os.path.samefile(a, b)  # hard links and bind mounts as well
    return a == b


def _resolved(path: str | os.PathLike[str]) -> Path:
    return Path(os.path.realpath(os.path.abspath(path)))


def check_outputs_apart(
    outputs: Sequence[tuple[str, str | os.PathLike[str] | None]],
    inputs: Sequence[tuple[str, str | os.PathLike[str] | None]],
) -> None:
    """Refuse, before any work, an output that is, contains or lies inside an input (a
    command never destroys a file it did not create), or two outputs that are one file.

    Args:
        outputs, inputs: ``(what, path)`` pairs, ``what`` as the user names it (``--output``,
            ``reference_file``); ``None`` and ``"-"`` (stdin/stdout) are skipped.

    Raises:
        ValueError: one line naming both paths and the fix.
    """
    outs = [(what, Path(p), _resolved(p)) for what, p in outputs if p not in (None, "", "-")]
    ins = [(what, Path(p), _resolved(p)) for what, p in inputs if p not in (None, "", "-")]
    for i, (what, path, out) in enumerate(outs):
        for in_what, in_path, inp in ins:
            if _same(out, inp):
                relation = "is"
            elif out in inp.parents:
                relation = "contains"
            elif inp.is_dir() and inp in out.parents:
                relation = "lies inside"
            else:
                continue
            raise ValueError(
                f"{what} {path} {relation} the {in_what} {in_path}: writing it would destroy "
                f"the input; choose another {what}"
            )
        for other_what, other_path, other in outs[i + 1 :]:
            if _same(out, other):
                raise ValueError(
                    f"{what} {path} and {other_what} {other_path} are the same file; "
                    "give them different paths"
                )


def check_output_file(path: str | os.PathLike[str], what: str) -> None:
    """Refuse, before any work, an output file path that can never be written.

    Raises:
        IsADirectoryError, NotADirectoryError: one line with the path and the fix.
    """
    if str(path) in ("", "-"):
        return
    file = Path(path)
    if file.is_dir():
        raise IsADirectoryError(f"{what} {file} is a directory; give a file path")
    check_output_parent(file, what)


def check_output_parent(path: str | os.PathLike[str], what: str) -> None:
    """Refuse, before any work, an output path below a regular file or in a directory that
    takes no new file (``/proc``, read-only, no permission): a file is made and removed there.

    Raises:
        NotADirectoryError, OSError: one line with the path, the cause and the fix.
    """
    file = Path(path)
    parent = next(p for p in file.absolute().parents if p.exists())
    if not parent.is_dir():
        raise NotADirectoryError(
            f"{what} {file} lies below {parent}, which is a file, not a directory; "
            "choose another path"
        )
    try:
        fd, probe = tempfile.mkstemp(prefix=".probe.", dir=parent)
    except OSError as err:
        raise OSError(
            f"{what} {file} cannot be written: {parent} takes no new file "
            f"({err.strerror or err}); choose another path"
        ) from None
    os.close(fd)
    os.unlink(probe)
