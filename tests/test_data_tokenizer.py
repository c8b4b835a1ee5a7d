"""Byte-level BPE tokenizer: fixed special ids, lossless round trip, serialisation."""

from __future__ import annotations

import gzip
import itertools
from pathlib import Path

import pytest

from transformer_mt.data.tokenizer import FILENAME, Tokenizer

MULTI30K = Path(__file__).resolve().parents[1] / "../shared/data/multi30k"

SAMPLE = [
    ("A man in an orange hat starring at something.", "Ein Mann mit einem orangefarbenen Hut, der etwas anstarrt."),
    ("Two young, White males are outside near many bushes.", "Zwei junge weiße Männer sind im Freien in der Nähe vieler Büsche."),
    ("A little girl climbing into a wooden playhouse.", "Ein kleines Mädchen klettert in ein Spielhaus aus Holz."),
    ("A boy's \"big\" jump -- (50%) off the ramp!", "Ein Junge springt über die Rampe; «groß» & schön?"),
]  # fmt: skip


def sample_lines() -> tuple[list[str], list[str]]:
    """2,000 Multi30k training pairs when available, else the inline sample."""
    if (MULTI30K / "train.en.gz").is_file():
        with (
            gzip.open(MULTI30K / "train.en.gz", "rt") as en,
            gzip.open(MULTI30K / "train.de.gz", "rt") as de,
        ):
            pairs = [
                (s.rstrip("\n"), t.rstrip("\n")) for s, t in itertools.islice(zip(en, de), 2000)
            ]
    else:
        pairs = SAMPLE * 50
    return [s for s, _ in pairs], [t for _, t in pairs]


@pytest.fixture(scope="module")
def lines() -> tuple[list[str], list[str]]:
    return sample_lines()


@pytest.fixture(scope="module")
def joint(lines) -> Tokenizer:
    src, tgt = lines
    return Tokenizer.train([src], [tgt], vocab_size=1000, src_lang="en", tgt_lang="de")


def test_special_tokens_have_fixed_ids(joint):
    assert (joint.pad_id, joint.bos_id, joint.eos_id, joint.unk_id) == (0, 1, 2, 3)
    assert [joint.src.id_to_token(i) for i in range(4)] == ["<pad>", "<bos>", "<eos>", "<unk>"]
    assert joint.joint and joint.src_vocab_size == joint.tgt_vocab_size <= 1000
    if (MULTI30K / "train.en.gz").is_file():  # 2,000 real pairs fill the whole vocabulary;
        assert joint.src_vocab_size == 1000  # the 4-pair inline sample cannot


def test_round_trip_is_lossless_on_punctuation_umlauts_and_spacing(joint, lines):
    src, tgt = lines
    texts = src[:300] + tgt[:300] + [s for pair in SAMPLE for s in pair] + ["  two  spaces ", ""]
    ids = joint.encode_batch(texts)
    assert joint.decode_batch(ids) == texts
    assert all(i not in (joint.bos_id, joint.eos_id, joint.unk_id) for seq in ids for i in seq)


def test_emoji_and_cjk_do_not_crash_and_round_trip(joint):
    texts = ["Ein Hund 🐕 läuft 🏃‍♂️", "日本語のテキスト", "中文 와 한국어", "\u200b zero-width"]
    ids = joint.encode_tgt_batch(texts)
    assert all(joint.unk_id not in seq for seq in ids)  # byte fallback, never <unk>
    assert joint.decode_tgt_batch(ids) == texts


def test_decode_stops_at_eos_and_drops_specials(joint):
    ids = joint.encode_batch(["Ein Hund.", "Zwei Katzen."])
    padded = [
        [joint.bos_id, *ids[0], joint.eos_id, *ids[1], joint.pad_id],
        [*ids[1], joint.pad_id, joint.pad_id],
    ]
    assert joint.decode_batch(padded) == ["Ein Hund.", "Zwei Katzen."]


def test_json_and_directory_round_trip_keep_ids_and_languages(joint, tmp_path):
    again = Tokenizer.from_json(joint.to_json())
    texts = ["A dog runs.", "Die Männer laufen."]
    assert again.encode_batch(texts) == joint.encode_batch(texts)
    assert (again.src_lang, again.tgt_lang, again.joint) == ("en", "de", True)
    path = joint.save(tmp_path)
    assert path == tmp_path / FILENAME and path.is_file()
    loaded = Tokenizer.load(tmp_path)
    assert loaded.to_json() == joint.to_json()


def test_separate_vocabularies(lines, tmp_path):
    src, tgt = lines
    tok = Tokenizer.train([src], [tgt], vocab_size=600, joint=False, src_lang="en", tgt_lang="de")
    assert not tok.joint
    assert tok.src.get_vocab() != tok.tgt.get_vocab()
    assert tok.decode_src_batch(tok.encode_src_batch(src[:50])) == src[:50]
    assert tok.decode_tgt_batch(tok.encode_tgt_batch(tgt[:50])) == tgt[:50]
    loaded = Tokenizer.load(tok.save(tmp_path))
    assert not loaded.joint
    assert loaded.encode_tgt_batch(tgt[:5]) == tok.encode_tgt_batch(tgt[:5])


def test_training_is_deterministic(lines):
    src, tgt = lines
    a = Tokenizer.train([src[:500]], [tgt[:500]], vocab_size=400)
    b = Tokenizer.train([src[:500]], [tgt[:500]], vocab_size=400)
    assert a.to_json() == b.to_json()


def test_bad_inputs_explain_themselves(tmp_path):
    with pytest.raises(ValueError, match=r"vocab_size=100 is too small.*260"):
        Tokenizer.train([["a"]], [["b"]], vocab_size=100)
    with pytest.raises(FileNotFoundError, match="No tokenizer at"):
        Tokenizer.load(tmp_path)
    with pytest.raises(ValueError, match="Not a transformer_mt tokenizer"):
        Tokenizer.from_json('{"model": {}}')
