"""TranslationDataModule: batch format, filtering, tokenizer reuse, caching, Lightning, Hydra."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from transformer_mt.data.config import DataConfig
from transformer_mt.data.datamodule import TranslationDataModule
from transformer_mt.data.tokenizer import Tokenizer

from conftest import ROOT

MULTI30K = ROOT / "../shared/data/multi30k"
SIZES = {"train": 400, "validation": 40, "test": 30}


def numbers_dm(tmp_path: Path, work_dir="run", tokenizer=None, only_splits=None, **overrides):
    kwargs = dict(
        source="generated",
        sizes=SIZES,
        number_range=(2, 9999),
        vocab_size=300,
        max_tokens=512,
        max_len=64,
        seed=0,
    )
    kwargs.update(overrides)
    return TranslationDataModule(
        DataConfig(**kwargs),
        work_dir=None if work_dir is None else tmp_path / work_dir,
        tokenizer=tokenizer,
        only_splits=only_splits,
    )


@pytest.fixture(scope="module")
def dm(tmp_path_factory) -> TranslationDataModule:
    module = numbers_dm(tmp_path_factory.mktemp("dm"))
    module.setup()
    return module


def test_setup_exposes_tokenizer_and_sizes(dm):
    assert isinstance(dm.tokenizer, Tokenizer)
    assert dm.src_vocab_size == dm.tgt_vocab_size == dm.tokenizer.vocab_size <= 300
    assert dm.pad_id == 0
    assert (dm.work_dir / "tokenizer.json").is_file()


def test_batch_format(dm):
    batch = next(iter(dm.train_dataloader()))
    src, tgt, index = batch["src"], batch["tgt"], batch["index"]
    assert src.dtype == tgt.dtype == index.dtype == torch.long
    assert src.ndim == tgt.ndim == 2 and src.shape[0] == tgt.shape[0] == index.shape[0]
    assert len(batch["src_text"]) == len(batch["tgt_text"]) == src.shape[0]
    assert (tgt[:, 0] == dm.tokenizer.bos_id).all()
    assert src.shape[0] * max(src.shape[1], tgt.shape[1]) <= dm.config.max_tokens
    tok = dm.tokenizer
    for row in range(src.shape[0]):
        s = src[row][src[row] != tok.pad_id].tolist()
        t = tgt[row][tgt[row] != tok.pad_id].tolist()
        assert s[-1] == tok.eos_id and t[-1] == tok.eos_id
        assert tok.decode_batch([s], "src") == [batch["src_text"][row]]
        assert tok.decode_tgt_batch([t]) == [batch["tgt_text"][row]]
        # `index` points back at the example in its split.
        assert dm.splits["train"][int(index[row])]["src"] == batch["src_text"][row]


def test_eval_loader_covers_split_in_fixed_order(dm):
    def indices():
        return [i for b in dm.val_dataloader() for i in b["index"].tolist()]

    first = indices()
    assert sorted(first) == list(range(SIZES["validation"]))
    assert indices() == first
    texts = {i: s for b in dm.test_dataloader() for i, s in zip(b["index"].tolist(), b["src_text"])}
    assert [texts[i] for i in range(SIZES["test"])] == list(dm.splits["test"]["src"])


def test_train_loader_reshuffles_per_epoch(dm):
    loader = dm.train_dataloader()
    epoch0 = [b["index"].tolist() for b in loader]
    loader.batch_sampler.set_epoch(1)
    epoch1 = [b["index"].tolist() for b in loader]
    assert epoch0 != epoch1
    assert (
        sorted(i for b in epoch0 for i in b)
        == sorted(i for b in epoch1 for i in b)
        == list(range(SIZES["train"]))
    )


def test_ranks_from_trainer_get_disjoint_batches(dm, monkeypatch):
    class FakeTrainer:
        world_size = 2

        def __init__(self, rank: int) -> None:
            self.global_rank = rank

    total = len(dm.train_dataloader())  # batches of one epoch on a single device
    seen = []
    for rank in range(2):
        monkeypatch.setattr(dm, "trainer", FakeTrainer(rank))
        seen.append([tuple(b["index"].tolist()) for b in dm.train_dataloader()])
    monkeypatch.undo()
    assert len(seen[0]) == len(seen[1]) == -(-total // 2)
    shared = set(seen[0]) & set(seen[1])
    assert len(shared) == total % 2  # an odd count repeats one batch, else disjoint
    covered = {i for rank in seen for batch in rank for i in batch}
    assert covered == set(range(SIZES["train"]))


def test_tokenizer_is_reused_from_work_dir(tmp_path, caplog):
    first = numbers_dm(tmp_path)
    first.setup()
    saved = first.tokenizer.to_json()
    with caplog.at_level(logging.INFO, logger="transformer_mt.data.prepare"):
        again = numbers_dm(tmp_path)
        again.setup()
    assert "Reusing the tokenizer" in caplog.text
    assert again.tokenizer.to_json() == saved
    with pytest.raises(ValueError, match=r"trained with .*vocab_size.*fresh run directory"):
        numbers_dm(tmp_path, vocab_size=400).setup()
    with pytest.raises(ValueError, match=r"target language .* is 'de' but the data is 'fr'"):
        numbers_dm(tmp_path, tgt_lang="fr").setup()


def test_tokenized_splits_are_cached_as_arrow_files(tmp_path):
    first = numbers_dm(tmp_path, cache_dir=str(tmp_path / "cache"))
    first.setup()
    files = sorted((tmp_path / "cache").glob("*.arrow"))
    assert {f.name.split("-")[0] for f in files} == {"train", "validation", "test"}
    second = numbers_dm(tmp_path, cache_dir=str(tmp_path / "cache"))
    second.setup()
    assert sorted((tmp_path / "cache").glob("*.arrow")) == files  # nothing new written
    assert second.splits["train"].cache_files  # memory-mapped, not in memory


def write_files(
    directory: Path, train: list[tuple[str, str]], evals: list[tuple[str, str]]
) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for prefix, pairs in (("train", train), ("val", evals), ("test", evals)):
        for lang, column in (("en", 0), ("de", 1)):
            (directory / f"{prefix}.{lang}").write_text("".join(p[column] + "\n" for p in pairs))


def files_dm(tmp_path: Path, max_len: int, **overrides) -> TranslationDataModule:
    kwargs = dict(
        source="files",
        dir=str(tmp_path / "data"),
        prefixes={"train": "train", "validation": "val", "test": "test"},
        vocab_size=300,
        max_len=max_len,
        max_tokens=512,
    )
    kwargs.update(overrides)
    return TranslationDataModule(DataConfig(**kwargs))


def test_train_filters_empty_and_long_pairs_eval_keeps_and_truncates(tmp_path, caplog):
    long_src = " ".join(["word"] * 60)
    good = [("a small dog", "ein kleiner Hund")] * 20
    train = [*good, ("", "leer"), ("empty target", ""), (long_src, "lang")]
    evals = [("a cat", "eine Katze"), ("", ""), (long_src, "lang")]
    write_files(tmp_path / "data", train, evals)
    dm = files_dm(tmp_path, max_len=20)
    with caplog.at_level(logging.INFO, logger="transformer_mt.data.prepare"):
        dm.setup()
    assert len(dm.splits["train"]) == 20
    assert "Dropped 3 of 23 training pairs: 2 empty, 1 longer than max_len=20" in caplog.text
    assert "validation: truncated 1 sources" in caplog.text
    assert len(dm.splits["validation"]) == 3  # nothing dropped from eval sets
    batches = list(dm.val_dataloader())
    assert sorted(i for b in batches for i in b["index"].tolist()) == [0, 1, 2]
    assert max(b["src"].shape[1] for b in batches) == 20 + 1  # truncated + <eos>
    refs = {i: t for b in batches for i, t in zip(b["index"].tolist(), b["src_text"])}
    assert refs[2] == long_src and refs[1] == ""  # raw text stays complete


def test_all_training_pairs_filtered_is_an_error(tmp_path):
    long = " ".join(["word"] * 60)
    write_files(tmp_path / "data", [(long, long)] * 5, [("a", "b")])
    with pytest.raises(ValueError, match=r"All 5 training pairs were filtered.*max_len=10"):
        files_dm(tmp_path, max_len=10).setup()


def test_budget_smaller_than_max_len_is_rejected():
    with pytest.raises(ValueError, match=r"max_tokens=100 cannot hold .* max_len=256"):
        DataConfig(max_tokens=100, max_len=256)


@pytest.mark.skipif(not (MULTI30K / "train.en.gz").is_file(), reason="no Multi30k copy")
def test_multi30k_val_split_through_the_pipeline(tmp_path):
    """The shared copy, read via the project-relative path (validation as train: fast)."""
    dm = TranslationDataModule(
        DataConfig(
            source="files",
            dir=str(MULTI30K),
            prefixes={"train": "val", "validation": "val", "test": "test_2016_flickr"},
            vocab_size=1000,
            max_tokens=2048,
            max_len=100,
        )
    )
    dm.setup()
    assert len(dm.splits["test"]) == 1000
    batch = next(iter(dm.test_dataloader()))
    assert dm.tokenizer.decode_tgt_batch(batch["tgt"].tolist()) == batch["tgt_text"]


def test_hydra_configs_instantiate(tmp_path):
    from hydra import compose, initialize_config_dir
    from hydra.utils import instantiate

    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        for name in ("numbers", "multi30k", "iwslt2017", "wmt14", "files"):
            extra = ["data.dir=/tmp"] if name == "files" else []
            cfg = compose("train", overrides=[f"data={name}", *extra])
            config = instantiate(cfg.data)
            assert isinstance(config, DataConfig)
            assert config.name.startswith(name) and config.seed == cfg.seed
        cfg = compose(
            "train",
            overrides=["data=multi30k", "data.source=files", "data.prefixes.test=test_2017_flickr"],
        )
        config = instantiate(cfg.data)
    assert config.source == "files"
    assert config.dir == "../shared/data/multi30k"
    assert config.prefixes["test"] == "test_2017_flickr"
    assert TranslationDataModule(config).config is config  # taken whole


def test_lightning_calls_set_epoch_on_our_sampler(dm, tmp_path):
    import lightning.pytorch as pl

    class Recorder(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.weight = torch.nn.Parameter(torch.zeros(1))
            self.epochs: list[list[list[int]]] = []

        def on_train_epoch_start(self) -> None:
            self.epochs.append([])

        def training_step(self, batch, batch_idx):
            self.epochs[-1].append(batch["index"].tolist())
            return (self.weight * batch["src"].float().mean()).sum()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.0)

    model = Recorder()
    trainer = pl.Trainer(
        max_epochs=2,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        use_distributed_sampler=False,
        limit_val_batches=0,
        default_root_dir=tmp_path,
    )
    trainer.fit(model, datamodule=dm)
    first, second = model.epochs
    assert first != second
    assert (
        sorted(i for b in first for i in b)
        == sorted(i for b in second for i in b)
        == list(range(SIZES["train"]))
    )


def test_only_splits_tokenizes_just_the_requested_split(dm, tmp_path):
    evaluation = numbers_dm(tmp_path, tokenizer=dm.tokenizer, work_dir=None, only_splits=["test"])
    evaluation.setup("test")
    assert list(evaluation.splits) == ["test"]
    assert evaluation.available_splits == ["test", "train", "validation"]
    # The same rows and ids as the full set-up produced.
    assert evaluation.splits["test"]["src_ids"] == dm.splits["test"]["src_ids"]
    with pytest.raises(ValueError, match="only_splits needs a ready tokenizer"):
        numbers_dm(tmp_path, only_splits=["test"])
