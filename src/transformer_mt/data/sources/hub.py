"""The ``hub`` source: a translation data set from the Hugging Face Hub.

Flat language columns (``bentrevett/multi30k``) and the nested ``translation`` dict (``wmt14``)
are both understood. An unreachable Hub fails fast, with how to read local files instead.
Downloads go to the ``datasets`` cache (``HF_DATASETS_CACHE``), not ``data.cache_dir``.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlparse

import datasets

from transformer_mt.data.config import DEFAULT_HUB_SPLITS

FILES_HINT = "python train.py data=multi30k data.source=files data.dir=../shared/data/multi30k"


def _hub_offline() -> bool:
    """True when the user asked ``datasets``/``huggingface_hub`` not to go online."""
    truthy = {"1", "ON", "YES", "TRUE"}
    env = any(
        os.environ.get(var, "").upper() in truthy
        for var in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE")
    )
    return env or bool(datasets.config.HF_HUB_OFFLINE)


def _hub_reachable(timeout: float = 3.0) -> bool:
    """Can we open a TCP connection to the Hub endpoint? Fails fast where ``load_dataset``
    retries; behind a proxy a direct connection says nothing, so assume yes."""
    if any(os.environ.get(v) for v in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return True
    endpoint = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    host = endpoint.hostname or "huggingface.co"
    port = endpoint.port or (443 if endpoint.scheme == "https" else 80)
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def _hub_unreachable_message(hub_id: str, reason: str) -> str:
    if _hub_offline():  # offline mode is on already: the cache does not have it
        cache = "Offline mode is on and it is not in your datasets cache (HF_DATASETS_CACHE). "
    else:
        cache = (
            "If it is already in your datasets cache, set HF_DATASETS_OFFLINE=1 to use the "
            "cached copy. "
        )
    return (
        f"Cannot load {hub_id!r} from the Hugging Face Hub: {reason}. {cache}"
        f"Otherwise read local files instead, e.g. `{FILES_HINT}` (see "
        "configs/data/files.yaml for the file layouts)."
    )


def load_hub_corpus(
    hub_id: str | None,
    hub_config: str | None,
    src_lang: str,
    tgt_lang: str,
    *,
    splits: Mapping[str, str] | None = None,
    revision: str | None = None,
    cache_dir: str | None = None,
) -> datasets.DatasetDict:
    """Load a translation data set from the Hugging Face Hub.

    Args:
        src_lang: Source language; a column name or a key of ``translation``.
        splits: Our split name -> the Hub's split name.
        revision: Hub revision (branch, tag, commit or ``refs/convert/parquet``).

    Raises:
        ConnectionError: the Hub cannot be reached (one message, with the fix).
        ValueError: neither the language columns nor ``translation``, or a missing split.
    """
    if not hub_id:
        raise ValueError("source=hub needs a data set id: set data.hub_id, e.g. wmt14.")
    splits = dict(splits or DEFAULT_HUB_SPLITS)
    if not _hub_offline() and not _hub_reachable():
        raise ConnectionError(_hub_unreachable_message(hub_id, "no network connection"))
    try:
        raw = datasets.load_dataset(hub_id, hub_config, revision=revision, cache_dir=cache_dir)
    except (ConnectionError, OSError) as err:
        # FileNotFoundError means "not in the cache" offline, "no such data set" online.
        if isinstance(err, FileNotFoundError) and not _hub_offline():
            raise
        raise ConnectionError(_hub_unreachable_message(hub_id, str(err))) from None
    except RuntimeError as err:
        if "scripts are no longer supported" not in str(err):
            raise
        raise ValueError(
            f"{hub_id!r} is a script-based data set, which datasets>=4 cannot run; read the "
            "Hub's Parquet export instead: data.hub_revision=refs/convert/parquet."
        ) from None

    if not isinstance(raw, datasets.DatasetDict):  # load_dataset without split= gives a dict
        raise ValueError(f"{hub_id!r} did not load as splits; got {type(raw).__name__}.")
    out = {}
    for ours, theirs in splits.items():
        if theirs not in raw:
            raise ValueError(
                f"{hub_id!r} ({hub_config}) has no split {theirs!r} (it has {sorted(raw)}); "
                f"fix data.hub_splits.{ours}."
            )
        out[ours] = _to_src_tgt(raw[theirs], src_lang, tgt_lang, f"{hub_id}:{theirs}")
    return datasets.DatasetDict(out)


def _to_src_tgt(
    split: datasets.Dataset, src_lang: str, tgt_lang: str, where: str
) -> datasets.Dataset:
    """Flatten either row layout into ``src``/``tgt`` string columns."""
    columns = split.column_names
    if src_lang in columns and tgt_lang in columns:
        split = split.select_columns([src_lang, tgt_lang])
        return split.rename_columns({src_lang: "src", tgt_lang: "tgt"})
    if "translation" in columns:
        pair = split.features["translation"]
        languages = getattr(pair, "languages", None) or list(getattr(pair, "keys", list)())
        if languages and (src_lang not in languages or tgt_lang not in languages):
            raise ValueError(
                f"{where} has languages {list(languages)}, not {src_lang}-{tgt_lang}; "
                "set data.src_lang/data.tgt_lang or pick another config."
            )

        def flatten(batch: dict[str, list[Any]]) -> dict[str, list[str]]:
            pairs = batch["translation"]
            return {"src": [p[src_lang] for p in pairs], "tgt": [p[tgt_lang] for p in pairs]}

        return split.map(flatten, batched=True, remove_columns=columns, desc=f"Flatten {where}")
    raise ValueError(
        f"{where} has columns {columns}; expected {src_lang!r} and {tgt_lang!r} "
        "or a 'translation' dict. Check data.src_lang/data.tgt_lang."
    )
