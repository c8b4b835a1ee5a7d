"""What the two Hydra commands (train, evaluate) share: the configs, their schemas, the spelling,
and how their errors end: one ``error:`` line for a config that does not compose
(:func:`run_entry_point`), and a multirun job's failure handed back to Hydra (:func:`task`).

``python train.py`` / ``python evaluate.py`` in a checkout and the installed
``transformer-mt-train`` / ``transformer-mt-evaluate`` all start here, on the Hydra configs
shipped inside the package (``transformer_mt/configs``), so they run from any directory.
"""

from __future__ import annotations

import functools
import os
import re
import sys
import traceback
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from transformer_mt.errors import (
    EXIT_INTERRUPTED,
    EXIT_USER_ERROR,
    HYDRA_RAISES,
    JobFailed,
    SettingError,
    debug,
    exit_code_for,
    exit_with,
    guarded,
    one_line,
)

#: The Hydra config directory inside the installed package.
CONFIG_DIR = str(Path(__file__).resolve().parent.parent / "configs")

F = TypeVar("F", bound=Callable[..., Any])


def register_configs() -> None:
    """Put the schemas written in code into Hydra's ConfigStore (idempotent).

    Called before composing: by the commands here, and by tests that compose the YAML.
    """
    from transformer_mt.data.config import register_stored_overrides
    from transformer_mt.inference.settings import register_eval_schema
    from transformer_mt.training.config import register_schemas

    register_schemas()  # train.yaml's schema: types and keys checked at composition
    register_eval_schema()  # evaluate.yaml's
    register_stored_overrides()  # configs/evaluate.yaml's `data: stored`


def spelled(keys: Mapping[str, str]) -> Callable[[F], F]:
    """Write a :class:`SettingError`'s fix as the Hydra overrides ``keys`` name
    (``{"beam_size": "decoding.beam_size"}``; a setting not listed keeps its name)."""

    def spell(setting: str, value: Any) -> str:
        text = str(value).lower() if isinstance(value, bool) else value
        return f"{keys.get(setting, setting)}={text}"

    def decorate(fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            try:
                return fn(*args, **kwargs)
            except SettingError as err:
                raise ValueError(err.render(spell)) from None

        return wrapper  # type: ignore[return-value]

    return decorate


def search_keys(prefix: str) -> dict[str, str]:
    """Every :class:`~transformer_mt.inference.search.SearchConfig` setting under ``prefix``."""
    from dataclasses import fields

    from transformer_mt.inference.search import SearchConfig

    return {f.name: f"{prefix}.{f.name}" for f in fields(SearchConfig)}


class _Task:
    """Whether a task function started: before that, a Hydra exit is a config error."""

    started = False


def task(fn: F) -> F:
    """:func:`~transformer_mt.errors.guarded` for the function ``@hydra.main`` runs: in a
    multirun (``-m``) a failed job must not end the sweep, so its known failure goes back to
    Hydra as :class:`~transformer_mt.errors.JobFailed` (``error: job #N (<overrides>): ...``),
    which records it and runs the next job."""

    @functools.wraps(fn)
    def job(*args: Any, **kwargs: Any) -> Any:
        _Task.started = True
        try:
            return fn(*args, **kwargs)
        except (Exception, KeyboardInterrupt) as exc:
            code = exit_code_for(exc)
            if code is not None and code != EXIT_INTERRUPTED and _in_multirun():
                raise _job_failed(exc, code) from None
            raise

    return guarded(job)  # type: ignore[return-value]


def _in_multirun() -> bool:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def _job_failed(exc: BaseException, code: int) -> JobFailed:
    """The exception that tells Hydra a multirun job failed, its reason on one line.

    Hydra prints it once (the basic sweeper, when the sweep ends) or records it (a sweep
    summary's ``error`` column); nothing is printed here, so the reason never appears twice.
    """
    from hydra.core.hydra_config import HydraConfig

    if debug():
        traceback.print_exception(exc)
    job = HydraConfig.get().job
    overrides = " ".join(HydraConfig.get().overrides.task)
    return JobFailed(f"error: job #{job.num} ({overrides}): {one_line(exc)}", code)


def run_entry_point(main: Callable[[], Any]) -> None:
    """Call a ``@hydra.main`` function; a config that does not compose is one ``error:`` line.

    Hydra reports a composition error (an unknown key, a value of the wrong type, an unknown
    group option) in several lines and exits 1. With ``HYDRA_FULL_ERROR`` set it raises the
    error instead, which this function prints as the one line every user error gets, with
    :data:`~transformer_mt.errors.EXIT_USER_ERROR`. It is called once, at a command's start.
    """
    if not debug():
        os.environ.update({"HYDRA_FULL_ERROR": "1", HYDRA_RAISES: "1"})
        sys.stderr = _WithoutHydraJobLine(sys.stderr)
    try:
        main()
    except SystemExit as exc:
        if exc.code == 1 and isinstance(exc.__context__, JobFailed):
            sys.exit(exc.__context__.exit_code)  # a multirun job failed: its status
        if exc.code == 1 and not _Task.started:
            sys.exit(EXIT_USER_ERROR)
        raise
    except JobFailed as exc:  # raised through Hydra, which HYDRA_FULL_ERROR makes re-raise
        sys.stdout.flush()
        print(str(exc), file=sys.stderr, flush=True)
        sys.exit(exc.exit_code)
    except Exception as exc:
        code = exit_code_for(exc)
        if code is None or _Task.started:
            raise
        exit_with(f"error: {composition_error(exc)}", code)


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
