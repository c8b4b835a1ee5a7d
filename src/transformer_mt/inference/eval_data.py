"""The data an evaluation decodes: the checkpoint's data config with the ``data.*`` overrides
on top, checked against the checkpoint's languages, one split tokenized.

The data config (:class:`~transformer_mt.data.config.DataConfig`) comes from, in order: the
checkpoint (``transformer_mt.data``), the training run's ``.hydra/config.yaml`` next to the
checkpoint's folder, or the overrides alone; set ``data.*`` overrides always win.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from transformer_mt.checkpoint import LoadedModel
from transformer_mt.data.config import DataConfig
from transformer_mt.data.prepare import PreparedData, prepare

log = logging.getLogger(__name__)


class DataMismatchError(ValueError):
    """The data to evaluate on does not fit the checkpoint (languages, split)."""


# ----------------------------------------------------------------------------- data config


def _deep_merge(base: dict[str, Any], overlay: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in overlay.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = _deep_merge(dict(merged[key]), value)
        else:
            merged[key] = value
    return merged


def _training_run_data(ckpt_path: Path) -> dict[str, Any] | None:
    """The data config in the Hydra config of the run that wrote ``ckpt_path``, if any."""
    for run_dir in (ckpt_path.parent.parent, ckpt_path.parent):
        config_file = run_dir / ".hydra" / "config.yaml"
        if not config_file.is_file():
            continue
        try:
            conf = OmegaConf.load(config_file)  # YAML (safe loader), not pickle
            data = OmegaConf.to_container(conf.data, resolve=True)
        except Exception as err:  # a broken or partial file: fall back to the overrides
            log.warning("could not read the data config in %s: %s", config_file, err)
            continue
        if isinstance(data, dict):
            log.info("data config from the training run: %s", config_file)
            return absolute_data_dir(data, run_dir / ".hydra" / "hydra.yaml")
    return None


def absolute_data_dir(data: dict[str, Any], hydra_file: Path) -> dict[str, Any]:
    """A relative ``data.dir`` resolved against the directory the training run started in."""
    typed = data.get("dir")
    if not typed or Path(str(typed)).is_absolute() or not hydra_file.is_file():
        return data
    try:
        cwd = OmegaConf.select(OmegaConf.load(hydra_file), "hydra.runtime.cwd")
    except Exception:  # a broken file: keep the path as typed
        return data
    if not cwd:
        return data
    return {**data, "dir": str(Path(str(cwd)) / str(typed)), "dir_as_typed": typed}


def resolve_data_config(overlay: Mapping[str, Any], loaded: LoadedModel) -> tuple[DataConfig, str]:
    """The data config to evaluate on (the set ``data.*`` values ``overlay`` over what the
    checkpoint or its training run stores) and where it came from.

    Returns:
        ``(config, origin)``: origin is ``"checkpoint"``, ``"training run"`` or ``"overrides"``.
    """
    if loaded.data is not None:
        base, origin = dict(loaded.data), "checkpoint"
    else:
        run_data = _training_run_data(loaded.path)
        base, origin = (run_data, "training run") if run_data is not None else ({}, "overrides")
    merged = _deep_merge(base, overlay)
    if origin == "overrides" and "source" not in merged:
        raise DataMismatchError(
            f"{loaded.path} stores no data config and no .hydra/config.yaml of its training "
            "run was found; name the data: data=numbers (with the training overrides, e.g. "
            "data.sizes.train=N), data=multi30k data.source=files, or data=files data.dir=DIR"
        )
    return DataConfig.from_dict(merged), origin


def check_languages(data: DataConfig, loaded: LoadedModel) -> None:
    """The data's languages must be the checkpoint's."""
    for side, have, want in (
        ("source", data.src_lang, loaded.src_lang),
        ("target", data.tgt_lang, loaded.tgt_lang),
    ):
        if want is not None and have != want:
            raise DataMismatchError(
                f"{loaded.path} translates {loaded.src_lang}->{loaded.tgt_lang} but the data "
                f"is {data.src_lang}->{data.tgt_lang} ({side} language differs); "
                f"set data.src_lang={loaded.src_lang} data.tgt_lang={loaded.tgt_lang} or use "
                "a checkpoint trained for this direction"
            )


def load_split(data: DataConfig, loaded: LoadedModel, split: str) -> PreparedData:
    """Tokenize one split of ``data`` with the checkpoint's tokenizer."""
    prepared = prepare(data, tokenizer=loaded.tokenizer, only_splits=[split])
    if split not in prepared.splits:
        raise DataMismatchError(
            f"no split {split!r} in the data; it has {prepared.available_splits}. Add one with "
            f"'+data.prefixes.{split}=FILE_PREFIX' (files) or choose split=test"
        )
    return prepared
