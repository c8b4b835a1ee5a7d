"""transformer-mt: a small Transformer for machine translation.

The public Python API is the names in ``__all__`` (README "From Python"); everything else is
internal and may move. Each name is imported on first use, so ``import transformer_mt`` loads
neither torch nor Lightning and changes nothing in the process.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from transformer_mt.api import TrainResult, Translator, evaluate, train
    from transformer_mt.inference.search.settings import SearchConfig
    from transformer_mt.inference.translator import Translation

__all__ = ["SearchConfig", "TrainResult", "Translation", "Translator", "evaluate", "train"]

#: The module that defines each public name.
_HOMES = dict.fromkeys(["TrainResult", "Translator", "evaluate", "train"], "transformer_mt.api")
_HOMES["SearchConfig"] = "transformer_mt.inference.search.settings"
_HOMES["Translation"] = "transformer_mt.inference.translator"


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module 'transformer_mt' has no attribute {name!r}")
    value = getattr(importlib.import_module(_HOMES[name]), name)
    globals()[name] = value  # found directly from now on
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
