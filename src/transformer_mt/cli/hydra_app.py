"""What the two Hydra commands (train, evaluate) share: the configs, their schemas, the spelling.

``python train.py`` / ``python evaluate.py`` in a checkout and the installed
``transformer-mt-train`` / ``transformer-mt-evaluate`` all start here, on the Hydra configs
shipped inside the package (``transformer_mt/configs``), so they run from any directory.
"""

from __future__ import annotations

import functools

# isort: off
# First, before anything imports torch: OpenMP reads how its threads wait only when torch loads.
import transformer_mt.cli.openmp  # noqa: F401  (sets the short spin)
import transformer_mt.cli.onednn  # noqa: F401  (sizes oneDNN's kernel cache)

# isort: on

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from transformer_mt.errors import SettingError

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
