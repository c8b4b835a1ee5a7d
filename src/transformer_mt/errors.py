"""One error surface for every entry point: a user mistake is one line, never a traceback.

Entry points (train.py, evaluate.py, scripts/translate.py, ...) wrap the work they do in
:func:`guarded` and call their Hydra ``main`` through :func:`run_entry_point`::

    @hydra.main(version_base="1.3", config_path="configs", config_name="train")
    def main(cfg: DictConfig) -> float | None:
        return guarded(run)(cfg)

    if __name__ == "__main__":
        run_entry_point(main)

What the user sees on stderr, and the exit status:

- :class:`UserError`, ``ValueError``, ``OSError`` (missing files, permissions, full disk,
  ``ConnectionError`` for the Hub), OmegaConf/Hydra config errors:
  ``error: <cause and fix>``, exit 2 (:data:`EXIT_USER_ERROR`).
- A config that does not compose (unknown key, wrong type, unknown group option):
  ``error: <Hydra's message; the key and cause>``, exit 2 (see :func:`run_entry_point`).
- :class:`NonFiniteLossError`: ``error: <step, causes, checkpoint>``,
  exit 1 (:data:`EXIT_RUNTIME_ERROR`).
- :class:`TrainingInterrupted`, Ctrl-C: ``error: <checkpoint to resume from>``, exit 130.
- Anything else is a bug: its traceback, exit 1.
- In a multirun (``-m``) a job's known failure goes back to Hydra as :class:`JobFailed`, whose
  message is ``error: job #N (<overrides>): <cause and fix>``; the sweep goes on, Hydra prints
  that line once, and the command exits with the failed job's status (2 for a user error).

``HYDRA_FULL_ERROR=1`` or ``TRANSFORMER_MT_DEBUG=1`` prints the traceback before the line.
"""

from __future__ import annotations

import functools
import importlib
import os
import re
import sys
import traceback
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from hydra.errors import CompactHydraException

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
    "run_entry_point",
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


class JobFailed(CompactHydraException):
    """A multirun job's known failure: ``error: job #N (<overrides>): <reason>``.

    Hydra prints a :class:`~hydra.errors.CompactHydraException` as its message alone (no
    traceback); :func:`run_entry_point` turns the sweep's end into the job's exit status (2
    for a user error) instead of Hydra's 1.
    """

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message, exit_code)
        self.exit_code = exit_code

    def __str__(self) -> str:
        return str(self.args[0])


class _State:
    """Whether a guarded function started: before that, a Hydra exit is a config error."""

    task_started = False


#: Set beside HYDRA_FULL_ERROR by :func:`run_entry_point` (also for the processes it starts),
#: so that only a HYDRA_FULL_ERROR the user set asks for tracebacks.
_SET_BY_US = "TRANSFORMER_MT_HYDRA_RAISES"


def _debug() -> bool:
    names = DEBUG_VARIABLES[1:] if os.environ.get(_SET_BY_US) else DEBUG_VARIABLES
    return any(os.environ.get(var, "") not in ("", "0") for var in names)


def _root_cause(exc: BaseException) -> BaseException:
    """Unwrap Hydra's InstantiationException to the error raised by the ``_target_``."""
    from hydra.errors import InstantiationException

    while isinstance(exc, InstantiationException) and exc.__cause__ is not None:
        exc = exc.__cause__
    return exc


def exit_code_for(exc: BaseException) -> int | None:
    """The exit status for a known failure, or ``None`` for a bug (show its traceback)."""
    from hydra.errors import HydraException, InstantiationException
    from omegaconf.errors import OmegaConfBaseException

    if isinstance(exc, InstantiationException) and isinstance(_root_cause(exc), TypeError):
        return EXIT_USER_ERROR  # a wrong argument in a _target_ config, e.g. +data.typo=1
    exc = _root_cause(exc)
    if isinstance(exc, (TrainingInterrupted, KeyboardInterrupt)) or _during_ctrl_c(exc):
        return EXIT_INTERRUPTED
    if isinstance(exc, NonFiniteLossError):
        return EXIT_RUNTIME_ERROR
    user_errors = (UserError, ValueError, OSError, OmegaConfBaseException, HydraException)
    if isinstance(exc, user_errors):  # OSError covers FileNotFound, Permission, Connection
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
    from hydra.errors import InstantiationException

    if isinstance(exc, InstantiationException) and isinstance(_root_cause(exc), TypeError):
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


def _in_multirun() -> bool:
    """True inside a job of a Hydra multirun (``-m``): a sweep, not a single run."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def guarded(fn: F) -> F:
    """Wrap ``fn`` so that known failures print ``error: ...`` on stderr and exit.

    Unknown exceptions (bugs) propagate unchanged, with their traceback. In a multirun
    a failed job must not end the sweep: the exception goes back to Hydra, which records
    the job as failed (the sweep summary shows the reason) and runs the next one.
    """

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        _State.task_started = True
        try:
            return fn(*args, **kwargs)
        except (Exception, KeyboardInterrupt) as exc:
            code = exit_code_for(exc)
            if code is None:
                raise
            if code != EXIT_INTERRUPTED and _in_multirun():
                raise _job_failed(exc, code) from None
            if _debug():
                traceback.print_exc()
            sys.stdout.flush()
            print(f"error: {one_line(exc)}", file=sys.stderr, flush=True)
            sys.exit(code)

    return wrapper  # type: ignore[return-value]


def _job_failed(exc: BaseException, code: int) -> JobFailed:
    """The exception that tells Hydra a multirun job failed, its reason on one line.

    Hydra prints it once (the basic sweeper, when the sweep ends) or records it (a sweep
    summary's ``error`` column); nothing is printed here, so the reason never appears twice.
    """
    from hydra.core.hydra_config import HydraConfig

    if _debug():
        traceback.print_exception(exc)
    job = HydraConfig.get().job
    overrides = " ".join(HydraConfig.get().overrides.task)
    return JobFailed(f"error: job #{job.num} ({overrides}): {one_line(exc)}", code)


def run_entry_point(main: Callable[[], Any]) -> None:
    """Call a ``@hydra.main`` function; a config that does not compose is one ``error:`` line.

    Hydra reports a composition error (an unknown key, a value of the wrong type, an unknown
    group option) in several lines and exits 1. With ``HYDRA_FULL_ERROR`` set it raises the
    error instead, which this function prints as the one line every user error gets, with
    :data:`EXIT_USER_ERROR`.
    """
    if not _debug():
        os.environ.update({"HYDRA_FULL_ERROR": "1", _SET_BY_US: "1"})
        sys.stderr = _WithoutHydraJobLine(sys.stderr)
    try:
        main()
    except SystemExit as exc:
        if exc.code == 1 and isinstance(exc.__context__, JobFailed):
            sys.exit(exc.__context__.exit_code)  # a multirun job failed: its status
        if exc.code == 1 and not _State.task_started:
            sys.exit(EXIT_USER_ERROR)
        raise
    except JobFailed as exc:  # raised through Hydra, which HYDRA_FULL_ERROR makes re-raise
        sys.stdout.flush()
        print(str(exc), file=sys.stderr, flush=True)
        sys.exit(exc.exit_code)
    except Exception as exc:
        code = exit_code_for(exc)
        if code is None or _State.task_started:
            raise
        if _debug():
            traceback.print_exc()
        sys.stdout.flush()
        print(f"error: {composition_error(exc)}", file=sys.stderr, flush=True)
        sys.exit(code)


class _WithoutHydraJobLine:
    """stderr without the line Hydra writes before re-raising a failed multirun job
    (``Error executing job with overrides: [...]``): the job's own ``error: job #N (<overrides>):
    ...`` line says the same, and a user error is one line."""

    PREFIX = "Error executing job with overrides: "

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        if text.startswith(self.PREFIX):
            return len(text)
        return self._stream.write(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def composition_error(exc: BaseException) -> str:
    """One line for a config that Hydra could not compose: its message, the OmegaConf cause
    (key and reason) and where to see every key."""
    # Hydra's hints name its search path and suggest appending with '+', which a typed node
    # refuses as well: the key and the cause say what to fix.
    message = one_line(exc).split(" Config search path:")[0]
    parts = [re.sub(r"\.? To append to your config use \S+", "", message)]
    cause = exc.__cause__
    if cause is not None and str(cause):
        first = str(cause).strip().splitlines()[0]
        key = getattr(cause, "full_key", None)
        parts.append(f"{key}: {first}" if key and key not in first else first)
    return "; ".join(parts) + ("; add --cfg job to the command to see every key with its value")


def refuse_unknown_keys(node: Any, where: str = "") -> None:
    """Refuse a key that no schema field names, at any depth (``+data.vocab_sise=100``).

    Hydra's ``+key=value`` adds a key even to a typed node, and ``OmegaConf.to_object`` keeps
    it as a stray attribute, so the typed settings would silently ignore a misspelt setting.

    Raises:
        ValueError: naming the key and the keys its node has.
    """
    import dataclasses

    from omegaconf import DictConfig, OmegaConf

    schema = OmegaConf.get_type(node)
    if not (isinstance(schema, type) and dataclasses.is_dataclass(schema)):
        return  # a plain mapping (data.prefixes, ...): any key is a value
    known = [f.name for f in dataclasses.fields(schema)]
    for key in node:
        path = f"{where}{key}"
        if key not in known:
            place = f"of {where[:-1]}" if where else "at the top"
            raise ValueError(
                f"unknown setting {path!r}; the settings {place} "
                f"are {', '.join(k for k in known if not k.startswith('_'))} (fix its spelling, "
                "or drop the override)"
            )
        child = node._get_node(key)
        if isinstance(child, DictConfig) and not child._is_missing() and not child._is_none():
            refuse_unknown_keys(child, f"{path}.")
