"""Several directions in one corpus: loading, the joint BPE, target-language tags."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from transformer_mt.data.config import DataConfig
from transformer_mt.data.datamodule import TranslationDataModule
from transformer_mt.data.directions import (
    parse_directions,
    sample_epoch,
    summary_languages,
    temperature_shares,
)

from conftest import write_multi_corpus, write_unequal_directions


def multi_dm(corpus: Path, directions: list[str], **overrides) -> TranslationDataModule:
    settings = dict(
        source="files",
        dir=str(corpus),
        prefixes={"train": "train", "validation": "val", "test": "test"},
        directions=directions,
        vocab_size=300,
        max_len=32,
    )
    settings.update(overrides)
    dm = TranslationDataModule(DataConfig(**settings), work_dir=None)
    dm.setup()
    return dm


def test_directions_are_parsed_and_summarised() -> None:
    pairs = parse_directions(["de-en", "fr-en"])
    assert pairs == [("de", "en"), ("fr", "en")]
    assert summary_languages(pairs) == ("mul", "en")
    assert summary_languages(parse_directions(["en-de", "en-fr"])) == ("en", "mul")
    config = DataConfig(directions=["en-de", "de-en"])
    assert (config.src_lang, config.tgt_lang) == ("mul", "mul")
    for bad, words in (
        (["en_de"], "is not src-tgt"),
        (["en-de", "en-de"], "twice"),
        (["en-en"], "into itself"),
    ):
        with pytest.raises(ValueError, match=words):
            DataConfig(directions=bad)


def test_each_source_starts_with_its_target_tag(tmp_path: Path) -> None:
    dm = multi_dm(write_multi_corpus(tmp_path / "c"), ["en-de", "en-fr"])
    tok = dm.tokenizer
    assert tok.target_languages == ["de", "fr"]
    de, fr = tok.tag_id("de"), tok.tag_id("fr")
    assert de is not None and fr is not None and de != fr
    train = dm.splits["train"]
    assert len(train) == 60 and sorted(set(train["direction"])) == ["en-de", "en-fr"]
    for row in train.select(range(0, 60, 7)):
        want = de if row["direction"] == "en-de" else fr
        assert row["src_ids"][0] == want
        assert row["src_ids"][1:] == tok.encode_src_batch([row["src"]])[0]
        assert want not in row["tgt_ids"]
    # The tags are one token each and never come out of decoding as text.
    assert tok.decode_batch([[de, *tok.encode_src_batch(["one house"])[0]]], "src") == ["one house"]


def test_each_language_trains_the_bpe_once(tmp_path: Path, monkeypatch) -> None:
    """Many-to-English has English on every direction's target side: the BPE reads it once."""
    from transformer_mt.data import tokenizer as tokenizer_module

    seen: list[str] = []
    train_bpe = tokenizer_module.train_bpe

    def recording(texts, *args, **kwargs):
        texts = [batch for batch in texts]
        seen.extend(line for batch in texts for line in batch)
        return train_bpe(iter(texts), *args, **kwargs)

    monkeypatch.setattr(tokenizer_module, "train_bpe", recording)
    multi_dm(write_multi_corpus(tmp_path / "c"), ["de-en", "fr-en"])
    assert len(seen) == 3 * 30  # de, en, fr: each training file once
    assert len(set(seen)) == 90


def test_a_missing_direction_file_is_one_line(tmp_path: Path) -> None:
    corpus = write_multi_corpus(tmp_path / "c", langs=("en", "de"))
    with pytest.raises(FileNotFoundError, match=r"train\.fr"):
        multi_dm(corpus, ["en-de", "en-fr"])


def test_a_directions_own_files_must_be_complete_and_aligned(tmp_path: Path) -> None:
    corpus = write_unequal_directions(tmp_path / "c")
    lines = (corpus / "train.fr-en.en").read_text(encoding="utf-8").splitlines()
    (corpus / "train.fr-en.en").write_text("\n".join(lines[:-1]) + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"train\.fr-en"):
        multi_dm(corpus, ["de-en", "fr-en"])
    (corpus / "train.fr-en.en").unlink()
    with pytest.raises(FileNotFoundError, match=r"train\.fr-en\.en"):
        multi_dm(corpus, ["de-en", "fr-en"])


def test_a_tag_in_the_text_is_text_and_a_tag_piece_is_refused(tmp_path: Path) -> None:
    dm = multi_dm(write_multi_corpus(tmp_path / "c"), ["en-de", "en-fr"])
    tok = dm.tokenizer
    ids = tok.encode_src_batch(["one <2fr> house"])[0]
    assert tok.tag_id("fr") not in ids  # typed, it is characters
    assert tok.decode_batch([ids], "src") == ["one <2fr> house"]
    reloaded = type(tok).from_json(tok.to_json())  # the rule survives the checkpoint
    assert reloaded.encode_src_batch(["one <2fr> house"]) == [ids]
    assert reloaded.tag_id("fr") == tok.tag_id("fr")
    clash = type(tok).from_json(tok.to_json())
    clash.src.add_tokens(["<2cs>"])  # a vocabulary that already has the piece
    with pytest.raises(ValueError, match=r"language tag\(s\) \['<2cs>'\] are already pieces"):
        clash.add_target_tags(["cs"])


def test_separate_vocabularies_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="needs one joint vocabulary"):
        multi_dm(write_multi_corpus(tmp_path / "c"), ["en-de", "en-fr"], joint_vocab=False)


def test_temperature_shares_flatten_the_mix_towards_uniform() -> None:
    assert temperature_shares([900, 100], 1.0) == pytest.approx([0.9, 0.1])
    # 0.9^(1/5) : 0.1^(1/5), normalised
    assert temperature_shares([900, 100], 5.0) == pytest.approx([0.6081, 0.3919], abs=1e-4)
    assert temperature_shares([900, 100], 1e9) == pytest.approx([0.5, 0.5])


def test_an_epoch_draws_each_direction_its_share_without_early_repeats() -> None:
    groups = np.array([0] * 900 + [1] * 100)
    assert sample_epoch(groups, 1.0, seed=0) is None  # proportional: the corpus itself
    epoch = sample_epoch(groups, 5.0, seed=0)
    assert epoch is not None and len(epoch) == 1000
    counts = np.bincount(epoch, minlength=1000)
    # 608 of the large direction, each at most once; 392 of the small: 3 passes + 92.
    assert (counts[:900] <= 1).all() and counts[:900].sum() == 608
    assert counts[900:].sum() == 392 and set(counts[900:].tolist()) == {3, 4}
    again, other = sample_epoch(groups, 5.0, seed=0), sample_epoch(groups, 5.0, seed=1)
    assert np.array_equal(epoch, again) and not np.array_equal(epoch, other)


def test_each_direction_may_have_files_of_its_own(tmp_path: Path) -> None:
    dm = multi_dm(write_unequal_directions(tmp_path / "c"), ["de-en", "fr-en"])
    directions = dm.splits["train"]["direction"]
    assert directions.count("de-en") == 40 and directions.count("fr-en") == 8
    assert dm.splits["validation"]["direction"].count("fr-en") == 40  # val.fr, shared


def test_temperature_sampling_resamples_the_training_epoch(tmp_path: Path) -> None:
    """At T=5 an epoch of the 40 + 8 pairs holds 48 examples in the flattened mix (the 8
    fr-en pairs repeated), batches stay within the budget, and each epoch draws anew."""
    dm = multi_dm(
        write_unequal_directions(tmp_path / "c"), ["de-en", "fr-en"], direction_temperature=5.0
    )
    directions = np.array(dm.splits["train"]["direction"])
    shares = temperature_shares([40, 8], 5.0)
    epochs = [dm.epoch_examples(e) for e in (0, 1)]
    for examples in epochs:
        assert examples is not None and len(examples) == 48
        assert (directions[examples] == "fr-en").sum() == round(shares[1] * 48)
    assert not np.array_equal(*epochs)
    # The loader of epoch 0 yields exactly that epoch's examples (by their source index).
    index = np.array(dm.splits["train"]["index"])
    seen = [i for batch in dm.train_dataloader() for i in batch["index"].tolist()]
    assert sorted(seen) == sorted(index[epochs[0]].tolist())
    sampler = dm.batch_sampler("train", epoch=1)
    src, tgt = (np.asarray(x)[epochs[1]] for x in dm.data.lengths["train"])
    for batch in sampler.batches(1):
        assert len(batch) * max(src[batch].max() + 1, tgt[batch].max() + 2) <= 2048


def test_a_temperature_that_is_not_positive_is_refused() -> None:
    for bad in (0.0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="direction_temperature must be a positive number"):
            DataConfig(directions=["en-de", "en-fr"], direction_temperature=bad)
