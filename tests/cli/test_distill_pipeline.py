"""Distillation end to end on the embedded data (``distill.teacher=[...]``): a tiny teacher
translates the training sources, a tiny student trains on them, a second student of the same
teacher reuses them; validation and test keep the human references."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from transformer_mt import train
from transformer_mt.data.config import DataConfig
from transformer_mt.data.sources import generate_numbers_corpus, load_corpus, with_train_targets
from transformer_mt.inference.distill import file_digest

from conftest import FAST_TRAIN


@pytest.fixture(scope="module")
def teacher(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = train(overrides=[*FAST_TRAIN, f"run_dir={tmp_path_factory.mktemp('teacher')}"])
    return run.run_dir / "checkpoints" / "last.ckpt"


def test_a_student_trains_on_its_teachers_translations_and_a_second_reuses_them(
    teacher: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from transformer_mt.checkpoint import load_model

    kept = tmp_path / "distilled"
    student = [*FAST_TRAIN, f"distill.teacher=[{teacher}]", f"distill.dir={kept}",
               "distill.beam_size=2", "distill.shard_size=128"]  # fmt: skip
    first = train(overrides=[*student, f"run_dir={tmp_path / 'student'}"])
    record = json.loads((first.run_dir / "distilled.json").read_text(encoding="utf-8"))
    targets = Path(record["targets"])
    assert targets.parent.parent == kept
    assert record["checkpoints"] == [
        {"path": str(teacher.resolve()), "sha256": file_digest(teacher)}
    ]
    assert record["decoding"]["beam_size"] == 2 and record["decode"]["sentences"] == 300
    lines = targets.read_text(encoding="utf-8").splitlines()
    assert len(lines) == 300  # one per training source

    config = load_model(first.run_dir / "checkpoints" / "last.ckpt").data_config()
    assert config is not None
    assert config.train_targets == str(targets) and not config.train_targets_mix
    corpus, references = load_corpus(config), generate_numbers_corpus(
        src_lang=config.src_lang, tgt_lang=config.tgt_lang, sizes=config.sizes,
        number_range=config.number_range, seed=config.seed, task=config.task,
    )  # fmt: skip
    assert with_train_targets(corpus["train"], config)["tgt"] == lines
    assert lines != references["train"]["tgt"]  # a tiny teacher, not the references
    for split in ("validation", "test"):  # scored against the human references
        assert corpus[split]["tgt"] == references[split]["tgt"]

    def no_teacher(*args: object, **kwargs: object) -> None:
        raise AssertionError("the kept translations are decoded again")

    monkeypatch.setattr("transformer_mt.cli.options.load_translator", no_teacher)
    second = train(overrides=[*student, "model.n_decoder_layers=1", f"run_dir={tmp_path / 's2'}"])
    again = json.loads((second.run_dir / "distilled.json").read_text(encoding="utf-8"))
    assert again["targets"] == record["targets"]
    assert targets.read_text(encoding="utf-8").splitlines() == lines


def test_a_teacher_of_another_direction_or_a_missing_one_is_refused(
    teacher: Path, tmp_path: Path
) -> None:
    common = [*FAST_TRAIN, f"distill.dir={tmp_path / 'kept'}", f"run_dir={tmp_path / 'run'}"]
    with pytest.raises(ValueError, match="translates en->de, this run trains de->en"):
        train(overrides=[*common, f"distill.teacher=[{teacher}]", "data.src_lang=de",
                         "data.tgt_lang=en"])  # fmt: skip
    with pytest.raises(ValueError, match=r"nope\.ckpt is not a file"):
        train(overrides=[*common, f"distill.teacher=[{tmp_path / 'nope.ckpt'}]"])


def test_training_targets_replace_or_join_the_references_line_for_line(tmp_path: Path) -> None:
    config = DataConfig(sizes={"train": 5, "validation": 2, "test": 2})
    train_split = load_corpus(config)["train"]
    path = tmp_path / "targets.txt"
    path.write_text("".join(f"t{i}\n" for i in range(5)), encoding="utf-8")
    replaced = with_train_targets(
        train_split, DataConfig(**{**config.to_dict(), "train_targets": str(path)})
    )
    assert replaced["tgt"] == [f"t{i}" for i in range(5)] and replaced["src"] == train_split["src"]
    mixed = with_train_targets(
        train_split,
        DataConfig(**{**config.to_dict(), "train_targets": str(path), "train_targets_mix": True}),
    )
    assert mixed["tgt"] == [*train_split["tgt"], *replaced["tgt"]]
    path.write_text("t0\n", encoding="utf-8")
    with pytest.raises(ValueError, match="has 1 lines for 5 training pairs"):
        with_train_targets(
            train_split, DataConfig(**{**config.to_dict(), "train_targets": str(path)})
        )
