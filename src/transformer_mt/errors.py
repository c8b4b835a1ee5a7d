"""One error surface for every entry point: a user mistake is one line, never a traceback.

The exception types, the exit codes and :func:`guarded`, which turns a known failure into
``error: <cause and fix>`` on stderr and its exit status:

- :class:`UserError`, ``ValueError``, ``OSError`` (missing files, permissions, full disk,
  ``ConnectionError`` for the Hub), OmegaConf/Hydra config errors: exit 2
  (:data:`EXIT_USER_ERROR`).
- :class:`NonFiniteLossError`: exit 1 (:data:`EXIT_RUNTIME_ERROR`).
- :class:`TrainingInterrupted`, Ctrl-C: exit 130, the message naming the checkpoint.
- Anything else is a bug: its traceback, exit 1.

The Hydra commands add what a multirun and a config that does not compose need
(:mod:`transformer_mt.cli.hydra_app`). This module imports neither Hydra nor OmegaConf: it
knows their errors by the package their class comes from. ``HYDRA_FULL_ERROR=1`` or
``TRANSFORMER_MT_DEBUG=1`` prints the traceback before the line.
"""

from __future__ import annotations

import functools
import importlib
import os
import sys
import traceback
from collections.abc import Callable, Sequence
from typing import Any, NoReturn, TypeVar

__all__ = [
    "EXIT_INTERRUPTED",
    "EXIT_RUNTIME_ERROR",
    "EXIT_USER_ERROR",
    "JobFailed",
    "NonFiniteLossError",
    "TrainingInterrupted",
    "UserError",
    "exit_code_for",
    "guarded",
    "one_line",
    "os_error_line",
]

#: A mistake in the command line, the config or the input files: fix it and run again.
EXIT_USER_ERROR = 2
#: The run started but failed (non-finite loss, an unexpected bug).
EXIT_RUNTIME_ERROR = 1
#: Ctrl-C / SIGTERM: 128 + SIGINT, as shells report it.
EXIT_INTERRUPTED = 130

DEBUG_VARIABLES = ("HYDRA_FULL_ERROR", "TRANSFORMER_MT_DEBUG")

F = TypeVar("F", bound=Callable[..., Any])


class UserError(Exception):
    """A problem the user can fix; the message states the cause and the fix in one sentence."""


class SettingError(ValueError):
    """A setting with a value that cannot work, and the values that would.

    The library knows a setting by its name (``beam_size``); only a command knows how its user
    spells it (``decoding.beam_size=`` for Hydra, ``--beam-size`` for flags). So the message
    keeps the fix apart: ``fix`` holds ``(setting, value)`` pairs that :meth:`render` writes in
    the caller's spelling; ``str(err)`` spells them ``setting=value``.

    Args:
        problem: what is wrong, naming the setting (``beam_size must be >= 1, got 0``).
        fix: the settings and values to try, in order.
        lead: the words before the fix (``set``, ``use e.g.``).
        tail: words after it (``(greedy) or more``).
    """

    def __init__(
        self, problem: str, fix: Sequence[tuple[str, Any]], *, lead: str = "set", tail: str = ""
    ) -> None:
        self.problem, self.fix, self.lead, self.tail = problem, tuple(fix), lead, tail
        super().__init__(self.render())

    def render(self, spell: Callable[[str, Any], str] | None = None) -> str:
        """The message with each fix written by ``spell(setting, value)`` (default ``k=v``)."""
        spell = spell or (lambda key, value: f"{key}={value}")
        fixes = " ".join(spell(key, value) for key, value in self.fix)
        return f"{self.problem}; {self.lead} {fixes}{' ' + self.tail if self.tail else ''}"


class ExportError(UserError, ValueError):
    """A model cannot be exported, or an exported one read, as asked; the message names the
    option and the fix."""


#: How to get the optional dependencies of export and the CTranslate2 engine.
EXPORT_EXTRA_HINT = (
    "install the export extra: pip install '.[export]' in a clone of transformer-mt, or "
    "pip install 'dist/transformer_mt-<version>-py3-none-any.whl[export]' for a wheel"
)


def require_export_extra(module: str) -> Any:
    """Import an optional dependency of the ``export`` extra, or fail naming the extra."""
    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise ExportError(f"{module} is not installed ({err}); {EXPORT_EXTRA_HINT}") from None


class NonFiniteLossError(RuntimeError):
    """The training loss became NaN or infinite."""


class TrainingInterrupted(Exception):
    """Training stopped on Ctrl-C or SIGTERM; the message names the checkpoint to resume from."""


class JobFailed(UserError):
    """A multirun job's known failure: ``error: job #N (<overrides>): <reason>``, with the
    exit status the job would have had alone (:mod:`transformer_mt.cli.hydra_app`)."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message, exit_code)
        self.exit_code = exit_code

    def __str__(self) -> str:
        return str(self.args[0])


#: Set beside HYDRA_FULL_ERROR by the Hydra commands (also for the processes they start), so
#: that only a HYDRA_FULL_ERROR the user set asks for tracebacks.
HYDRA_RAISES = "TRANSFORMER_MT_HYDRA_RAISES"


def debug() -> bool:
    """Whether the user asked for tracebacks (:data:`DEBUG_VARIABLES`)."""
    names = DEBUG_VARIABLES[1:] if os.environ.get(HYDRA_RAISES) else DEBUG_VARIABLES
    return any(os.environ.get(var, "") not in ("", "0") for var in names)


def _config_error(exc: BaseException) -> bool:
    """An error of Hydra or OmegaConf (a config that cannot work), known by its package, or
    Lightning's refusal of a Trainer setting (its MisconfigurationException)."""
    packages = {c.__module__.partition(".")[0] for c in type(exc).__mro__}
    return bool(packages & {"hydra", "omegaconf"}) or (
        "lightning" in packages and type(exc).__name__ == "MisconfigurationException"
    )


def _instantiation(exc: BaseException) -> bool:
    """Hydra's InstantiationException: a ``_target_`` that failed, its error as the cause."""
    return _config_error(exc) and type(exc).__name__ == "InstantiationException"


def _root_cause(exc: BaseException) -> BaseException:
    """Unwrap Hydra's InstantiationException to the error raised by the ``_target_``."""
    while _instantiation(exc) and exc.__cause__ is not None:
        exc = exc.__cause__
    return exc


def exit_code_for(exc: BaseException) -> int | None:
    """The exit status for a known failure, or ``None`` for a bug (show its traceback)."""
    if _instantiation(exc) and isinstance(_root_cause(exc), TypeError):
        return EXIT_USER_ERROR  # a wrong argument in a _target_ config, e.g. +data.typo=1
    exc = _root_cause(exc)
    if isinstance(exc, (TrainingInterrupted, KeyboardInterrupt)) or _during_ctrl_c(exc):
        return EXIT_INTERRUPTED
    if isinstance(exc, NonFiniteLossError):
        return EXIT_RUNTIME_ERROR
    # OSError covers FileNotFound, Permission, Connection
    if isinstance(exc, (UserError, ValueError, OSError)) or _config_error(exc):
        return EXIT_USER_ERROR
    return None


def _during_ctrl_c(exc: BaseException) -> bool:
    """An error raised by cleanup code while a KeyboardInterrupt was propagating."""
    context = exc.__context__
    while context is not None:
        if isinstance(context, KeyboardInterrupt):
            return True
        context = context.__context__
    return False


def one_line(exc: BaseException) -> str:
    """The message of ``exc`` (unwrapped) folded onto a single line."""
    if _instantiation(exc) and isinstance(_root_cause(exc), TypeError):
        return (
            f"{_root_cause(exc)}; remove or fix that key (python train.py --cfg job shows all keys)"
        )
    exc = _root_cause(exc)
    if isinstance(exc, KeyboardInterrupt) or (
        _during_ctrl_c(exc) and not isinstance(exc, TrainingInterrupted)
    ):
        return "interrupted (Ctrl-C) outside training; no checkpoint was written"
    if isinstance(exc, OSError) and str(exc).startswith("[Errno"):
        return os_error_line(exc)
    text = str(exc)
    if isinstance(exc, KeyError) or not text:
        text = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    return " ".join(text.split())


#: The fix for an OS error, by errno name: what the user can do about it.
_OS_FIXES = {
    "ENOENT": "check the path",
    "EACCES": "fix its permissions or choose another path",
    "EPERM": "fix its permissions or choose another path",
    "EROFS": "the file system is read-only; choose another path",
    "ENOSPC": "free some disk space or choose another path",
    "EDQUOT": "free some disk space (quota) or choose another path",
    "ENOTDIR": "a part of the path is a file, not a directory; choose another path",
    "EISDIR": "it is a directory; give a file path",
    "EEXIST": "it exists already; choose another path",
    "ENAMETOOLONG": "shorten the path",
}


def os_error_line(exc: OSError) -> str:
    """An OS error as ``cannot use PATH: <reason>; <fix>``, never a raw ``[Errno N]``."""
    import errno

    name = errno.errorcode.get(exc.errno or 0, "")
    reason = exc.strerror or name or type(exc).__name__
    paths = [str(p) for p in (exc.filename, exc.filename2) if p is not None]
    where = f"cannot use {' -> '.join(paths)}: " if paths else ""
    fix = _OS_FIXES.get(name, "check the path and the disk")
    return f"{where}{reason}; {fix}"


def guarded(fn: F) -> F:
    """Wrap ``fn`` so that known failures print ``error: ...`` on stderr and exit.

    Unknown exceptions (bugs) propagate unchanged, with their traceback, and so does
    :class:`JobFailed`, which a Hydra multirun records as the job's failure.
    """

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except JobFailed:
            raise
        except (Exception, KeyboardInterrupt) as exc:
            code = exit_code_for(exc)
            if code is None:
                raise
            exit_with(f"error: {one_line(exc)}", code)

    return wrapper  # type: ignore[return-value]


def exit_with(line: str, code: int) -> NoReturn:
    """End the process with ``line`` on stderr and exit status ``code`` (the traceback of the
    exception being handled first, when the user asked for tracebacks)."""
    if debug():
        traceback.print_exc()
    sys.stdout.flush()
    print(line, file=sys.stderr, flush=True)
    sys.exit(code)
