"""BPE-dropout: sampled training segmentations, deterministic everywhere else."""

from __future__ import annotations

import csv
import random
from pathlib import Path

import pytest

from transformer_mt.data.bpe_dropout import BpeDropout, EpochSegmentation
from transformer_mt.data.config import DataConfig
from transformer_mt.data.datamodule import TranslationDataModule

from conftest import FILES_TRAIN, clock_of_batches, compose_train

SENTENCE = "Eine Gruppe von Männern lädt Baumwolle auf einen Lastwagen, der vor dem Geschäft parkt."


def dropout_dm(p: float, **overrides) -> TranslationDataModule:
    kwargs = dict(
        source="generated",
        sizes={"train": 400, "validation": 40, "test": 30},
        number_range=(2, 99999),
        vocab_size=600,
        max_tokens=400,
        max_len=64,
        seed=0,
        bpe_dropout=p,
    )
    kwargs.update(overrides)
    dm = TranslationDataModule(DataConfig(**kwargs), work_dir=None)
    dm.setup()
    return dm


@pytest.fixture(scope="module")
def dm() -> TranslationDataModule:
    return dropout_dm(0.1)


def test_without_dropout_the_ids_are_the_librarys(dm: TranslationDataModule) -> None:
    """p = 0 runs the same merges as ``tokenizers``: the sampler differs only by the skips."""
    tok = dm.tokenizer
    texts = [*dm.splits["train"]["src"][:200], *dm.splits["train"]["tgt"][:200], SENTENCE]
    plain = BpeDropout(tok.src, 0.0)
    ours = [[i for w in plain.words(t) for i in plain.segment(w, random.Random(0))] for t in texts]
    assert ours == tok.encode_src_batch(texts)


def test_one_sentence_gets_several_segmentations_across_epochs(dm: TranslationDataModule) -> None:
    seg = EpochSegmentation(dm.tokenizer.src, dm.tokenizer.tgt, [SENTENCE], [SENTENCE], p=0.1)
    samples = {tuple(seg.ids(epoch)[0][0]) for epoch in range(8)}
    assert len(samples) >= 3
    deterministic = tuple(dm.tokenizer.encode_src_batch([SENTENCE])[0])
    # Every sample spells the sentence; sampled ones are longer (merges were skipped).
    for ids in samples:
        assert dm.tokenizer.decode_batch([list(ids)], "src") == [SENTENCE]
        assert len(ids) >= len(deterministic)


def test_an_epoch_is_a_function_of_seed_and_epoch(dm: TranslationDataModule) -> None:
    """A resumed run rebuilds the epoch it stopped in, and gets the same sentences."""
    train = dm.splits["train"]
    make = lambda seed: EpochSegmentation(  # noqa: E731
        dm.tokenizer.src, dm.tokenizer.tgt, train["src"], train["tgt"], p=0.1, seed=seed
    )
    a, b = make(0), make(0)
    assert a.ids(3) == b.ids(3)
    assert a.ids(3) != a.ids(4)
    assert make(1).ids(3) != a.ids(3)


def test_rare_words_get_independent_draws_per_occurrence(dm: TranslationDataModule) -> None:
    """No cache hands one sample to every occurrence: a word seen twice in an epoch can come
    out two ways in that epoch."""
    seg = EpochSegmentation(
        dm.tokenizer.src, dm.tokenizer.tgt, [SENTENCE] * 8, [SENTENCE] * 8, p=0.3
    )
    src, _ = seg.ids(0)
    assert len({tuple(ids) for ids in src}) >= 3


def test_validation_never_changes_and_training_does(tmp_path: Path) -> None:
    plain, sampled = dropout_dm(0.0), dropout_dm(0.3)
    for split in ("validation", "test"):
        a = [b["src"].tolist() for b in plain.dataloader(split)]
        b = [b["src"].tolist() for b in sampled.dataloader(split)]
        assert a == b
    assert sampled.splits["train"]["src_ids"] == plain.splits["train"]["src_ids"]
    seg = sampled.segmentation()
    assert seg is not None and plain.segmentation() is None
    ids0, ids1 = seg.ids(0), seg.ids(1)
    assert ids0 != ids1
    assert ids0[0] != plain.splits["train"]["src_ids"]


def test_token_budget_holds_for_the_longer_sampled_sentences() -> None:
    """The sampler packs by the sampled lengths: a batch never exceeds ``max_tokens``."""
    dm = dropout_dm(0.3, max_tokens=300)
    plain_total = sum(map(len, dm.splits["train"]["tgt_ids"]))
    seg = dm.segmentation()
    assert seg is not None
    assert sum(map(len, seg.ids(0)[1])) > 1.1 * plain_total
    for epoch in (0, 1):
        sampler = dm.batch_sampler("train", epoch=epoch)
        sampler.set_epoch(epoch)
        src_ids, tgt_ids = seg.ids(epoch)
        seen = []
        for batch in sampler:
            width = max(max(len(src_ids[i]) + 1, len(tgt_ids[i]) + 2) for i in batch)
            assert len(batch) * width <= 300
            seen.extend(batch)
        assert sorted(seen) == list(range(len(src_ids)))


def test_bad_probability_is_one_line() -> None:
    with pytest.raises(ValueError, match=r"bpe_dropout must be in \[0, 1\), got 1.0"):
        DataConfig(bpe_dropout=1.0)


def test_training_sees_a_new_segmentation_every_epoch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real Trainer reloads the loader per epoch: each epoch trains on the segmentation
    drawn for it (which differ, above), and the run validates every epoch as usual."""
    loaded: list[int] = []
    ids = EpochSegmentation.ids

    def recording(self, epoch):
        loaded.append(epoch)
        return ids(self, epoch)

    monkeypatch.setattr(EpochSegmentation, "ids", recording)

    rows = _train_with_dropout(tmp_path, "trainer.max_epochs=3")
    assert {r["epoch"] for r in rows if r.get("val/bleu")} == {"0", "1", "2"}
    assert sorted(set(loaded)) == [0, 1, 2]


def _train_with_dropout(tmp_path: Path, *extra: str) -> list[dict[str, str]]:
    """Train with BPE-dropout 0.3 on a small corpus of files; the rows of its metrics.csv."""
    from transformer_mt.training.run import run

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for prefix in ("train", "val", "test"):
        for lang, word in (("en", "houses"), ("de", "Häuser")):
            lines = "".join(f"{word} number {i} stand near the river\n" for i in range(40))
            (corpus / f"{prefix}.{lang}").write_text(lines, encoding="utf-8")
    run_dir = tmp_path / "run"
    overrides = [o for o in FILES_TRAIN if not o.startswith("trainer.max_epochs")]
    run(compose_train(run_dir, [*overrides, f"data.dir={corpus}", "data.bpe_dropout=0.3", *extra]))
    with open(next(run_dir.rglob("metrics.csv")), newline="") as f:
        return list(csv.DictReader(f))


def test_validation_by_the_clock_keeps_its_pace_across_the_reloads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A time-based ``val_check_interval`` longer than an epoch still validates while the
    loader is reloaded every epoch (Lightning restarts its clock at each reload). Lightning's
    clock is replaced by a count of training batches, so nothing waits on time."""
    batches = clock_of_batches(monkeypatch, seconds_per_batch=1.0)
    rows = _train_with_dropout(
        tmp_path, "trainer.max_epochs=10", "trainer.val_check_interval='00:00:00:05'"
    )
    steps = [int(r["step"]) for r in rows if r.get("val/bleu")]
    epochs = {r["epoch"] for r in rows if r.get("val/bleu")}
    assert batches[0] >= 20 and len(epochs) < 10  # an interval is longer than an epoch
    assert len(steps) >= batches[0] // 5 - 1


@pytest.mark.slow
def test_resume_in_a_later_epoch_replays_its_segmentation(tmp_path: Path) -> None:
    """A run resumed in epoch 1 rebuilds that epoch's segmentation from the seed and ends
    with the uninterrupted run's weights, bit for bit."""
    import torch

    from transformer_mt.training.run import run

    from conftest import FAST_TRAIN

    settings = [
        *FAST_TRAIN,
        "trainer.max_epochs=2",
        "test_after_fit=false",
        "model.dropout=0.1",
        "data.bpe_dropout=0.2",
        "data.num_workers=2",
        "callbacks.recent_checkpoints.every_n_train_steps=5",
        "callbacks.recent_checkpoints.save_top_k=-1",
    ]
    reference, resumed = tmp_path / "reference", tmp_path / "resumed"
    run(compose_train(reference, settings))
    final = torch.load(reference / "checkpoints" / "last.ckpt", weights_only=True)
    in_epoch_1 = [
        p
        for p in sorted((reference / "checkpoints").glob("recent-epoch001-*.ckpt"))
        if torch.load(p, weights_only=True)["global_step"] < final["global_step"]
    ]
    assert in_epoch_1, "the reference run wrote no checkpoint inside epoch 1"
    run(compose_train(resumed, [*settings, f"ckpt_path={in_epoch_1[0]}"]))
    got = torch.load(resumed / "checkpoints" / "last.ckpt", weights_only=True)
    assert got["global_step"] == final["global_step"]
    for name, value in final["state_dict"].items():
        torch.testing.assert_close(got["state_dict"][name], value, rtol=0, atol=0, msg=name)
