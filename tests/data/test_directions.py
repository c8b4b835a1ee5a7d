"""Several directions in one corpus: loading, the joint BPE, target-language tags."""

from __future__ import annotations

from pathlib import Path

import pytest

from transformer_mt.data.config import DataConfig
from transformer_mt.data.datamodule import TranslationDataModule
from transformer_mt.data.directions import parse_directions, summary_languages

from conftest import write_multi_corpus


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
    assert tok.decode_src_batch([[de, *tok.encode_src_batch(["one house"])[0]]]) == ["one house"]


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


def test_a_tag_in_the_text_is_text_and_a_tag_piece_is_refused(tmp_path: Path) -> None:
    dm = multi_dm(write_multi_corpus(tmp_path / "c"), ["en-de", "en-fr"])
    tok = dm.tokenizer
    ids = tok.encode_src_batch(["one <2fr> house"])[0]
    assert tok.tag_id("fr") not in ids  # typed, it is characters
    assert tok.decode_src_batch([ids]) == ["one <2fr> house"]
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
