"""DataConfig: the one data config of YAML groups, the data module, checkpoints and evaluate."""

from __future__ import annotations

from dataclasses import fields, replace
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate

from transformer_mt.data.config import DataConfig, stored_overrides
from transformer_mt.inference.eval_data import resolve_data_config
from transformer_mt.inference.settings import data_overrides

from conftest import CONFIGS

GROUPS = sorted(p.stem for p in (CONFIGS / "data").glob("*.yaml"))

#: What train.py (as of the commit before DataConfig) stored under transformer_mt.data: the
#: resolved data group with its Hydra target, work_dir removed.
STORED_BY_EARLIER_CODE = {
    "_target_": "transformer_mt.data.datamodule.TranslationDataModule",
    "name": "numbers_en_de",
    "source": "generated",
    "src_lang": "en",
    "tgt_lang": "de",
    "sizes": {"train": 1000, "validation": 40, "test": 40},
    "task": "sentences",
    "number_range": [2, 99999],
    "vocab_size": 512,
    "joint_vocab": True,
    "min_frequency": 2,
    "max_tokens": 2048,
    "eval_max_tokens": 4096,
    "max_len": 64,
    "num_workers": 0,
    "num_proc": 1,
    "seed": 42,
    "cache_dir": None,
}


def compose_data(config_name: str, overrides: list[str]):
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        return compose(config_name, overrides=["run_dir=/tmp/unused", *overrides])


def test_every_data_group_instantiates_a_data_config_that_round_trips() -> None:
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        for group in GROUPS:
            extra = ["data.dir=/tmp"] if group == "files" else []
            cfg = compose("train", overrides=["run_dir=/tmp/unused", f"data={group}", *extra])
            config = instantiate(cfg.data)
            assert isinstance(config, DataConfig)
            assert config.seed == cfg.seed and config.name.startswith(group)
            assert DataConfig.from_dict(config.to_dict()) == config  # what checkpoints store


def test_numbers_group_and_dataclass_defaults_agree() -> None:
    """The defaults live in DataConfig; the default group may not say otherwise."""
    config = instantiate(compose_data("train", []).data)
    expected = DataConfig(name="numbers_en_de", seed=42, cache_dir=".cache/data")
    assert config == expected
    assert DataConfig().number_range == (2, 99999)  # was (0, 99999) in code, [2, 99999] in YAML


def test_config_stored_by_earlier_code_still_loads() -> None:
    config = DataConfig.from_dict(STORED_BY_EARLIER_CODE)
    assert config.sizes == {"train": 1000, "validation": 40, "test": 40}
    assert config.number_range == (2, 99999) and config.seed == 42
    assert config.to_dict()["number_range"] == [2, 99999]  # plain types for weights_only


def test_unknown_key_and_bad_values_name_the_fix() -> None:
    with pytest.raises(ValueError, match=r"unknown data config key\(s\) \['max_tokenz'\]"):
        DataConfig.from_dict({**STORED_BY_EARLIER_CODE, "max_tokenz": 5})
    with pytest.raises(ValueError, match=r"eval_max_tokens=10 cannot hold .* max_len=64"):
        DataConfig(eval_max_tokens=10)
    with pytest.raises(ValueError, match="Unknown generated task 'poems'"):
        DataConfig(task="poems")
    assert DataConfig(max_tokens=300, eval_max_tokens=None).eval_max_tokens == 300


def test_evaluate_overrides_cover_every_key_and_merge_over_the_stored_config() -> None:
    """evaluate.yaml's `data: stored` node is generated from DataConfig: no key list to keep."""
    node = stored_overrides()
    assert set(node) == {f.name for f in fields(DataConfig)}
    cfg = compose_data(
        "evaluate", ["ckpt_path=x", "data.prefixes.test=test_2017_flickr", "data.max_len=20"]
    )

    stored = DataConfig.from_dict(STORED_BY_EARLIER_CODE)

    class Loaded:  # the two attributes resolve_data_config reads
        data = stored.to_dict()
        path = Path("model.ckpt")

    config, origin = resolve_data_config(data_overrides(cfg.data), Loaded())
    assert origin == "checkpoint"
    changed = replace(stored, max_len=20, prefixes={**stored.prefixes, "test": "test_2017_flickr"})
    assert config == changed


def test_a_checkpoint_stores_data_dir_absolute_and_as_typed(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    stored = DataConfig(source="files", dir="corpus").stored()
    assert (stored["dir"], stored["dir_as_typed"]) == (str(tmp_path / "corpus"), "corpus")
    assert DataConfig.from_dict(stored).dir == str(tmp_path / "corpus")  # from any directory
    assert "dir_as_typed" not in DataConfig().stored()  # generated data has no directory


def test_a_relative_dir_of_an_older_run_resolves_against_where_it_started(tmp_path) -> None:
    from transformer_mt.inference.eval_data import absolute_data_dir

    hydra_file = tmp_path / ".hydra" / "hydra.yaml"
    hydra_file.parent.mkdir()
    hydra_file.write_text("hydra:\n  runtime:\n    cwd: /home/me/project\n")
    data = {"source": "files", "dir": "../shared/data/multi30k"}
    assert absolute_data_dir(data, hydra_file)["dir"] == "/home/me/project/../shared/data/multi30k"
    assert absolute_data_dir({"dir": "/abs"}, hydra_file) == {"dir": "/abs"}
