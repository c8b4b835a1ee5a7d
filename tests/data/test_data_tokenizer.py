"""Byte-level BPE tokenizer: fixed special ids, lossless round trip, serialisation."""

from __future__ import annotations

import gzip
import itertools
import json

import pytest

from transformer_mt.data.tokenizer import FILENAME, META_FILENAME, TARGET_FILENAME, Tokenizer

from conftest import FIXTURES, MULTI30K

SAMPLE = [
    ("A man in an orange hat starring at something.",
     "Ein Mann mit einem orangefarbenen Hut, der etwas anstarrt."),
    ("Two young, White males are outside near many bushes.",
     "Zwei junge weiße Männer sind im Freien in der Nähe vieler Büsche."),
    ("A little girl climbing into a wooden playhouse.",
     "Ein kleines Mädchen klettert in ein Spielhaus aus Holz."),
    ("A boy's \"big\" jump -- (50%) off the ramp!",
     "Ein Junge springt über die Rampe; «groß» & schön?"),
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
    assert tok.decode_batch(tok.encode_src_batch(src[:50]), "src") == src[:50]
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


# ------------------------------------------------------------ standard files, old format

FIXTURE_V1 = FIXTURES / "format_v1"


def test_saved_tokenizer_json_is_a_standard_tokenizers_file(joint, tmp_path):
    from tokenizers import Tokenizer as HFTokenizer

    path = joint.save(tmp_path)
    texts = ["A dog runs.", "Die Männer laufen."]
    bare = joint.encode_batch(texts)
    plain = HFTokenizer.from_file(str(path))
    # The post-processor appends <eos>: exactly the source row the model is trained on.
    assert [e.ids for e in plain.encode_batch(texts)] == [[*ids, joint.eos_id] for ids in bare]
    assert joint.encode_batch(texts, add_special_tokens=True) == [
        [*ids, joint.eos_id] for ids in bare
    ]
    assert plain.decode([*bare[0], joint.eos_id]) == texts[0]
    meta = json.loads((tmp_path / META_FILENAME).read_text())
    assert (meta["src_lang"], meta["tgt_lang"], meta["joint"]) == ("en", "de", True)
    assert not (tmp_path / TARGET_FILENAME).exists()


def test_transformers_fast_tokenizer_loads_the_file(joint, tmp_path):
    transformers = pytest.importorskip("transformers")
    path = joint.save(tmp_path)
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(path), pad_token="<pad>", eos_token="<eos>", unk_token="<unk>"
    )
    texts = ["A dog runs.", "Die Männer laufen."]
    assert fast(texts)["input_ids"] == joint.encode_batch(texts, add_special_tokens=True)
    assert fast.pad_token_id == joint.pad_id and fast.eos_token_id == joint.eos_id


def test_template_ids_equal_the_collated_rows(joint):
    from transformer_mt.data.datamodule import Collate

    texts = ["A dog runs.", "Die Männer laufen im Park."]
    bare = joint.encode_batch(texts)
    columns = {"src_ids": bare, "tgt_ids": bare, "index": [0, 1], "src": texts, "tgt": texts}
    batch = Collate(joint.pad_id, joint.bos_id, joint.eos_id, max_len=50)(columns)
    with_specials = joint.encode_batch(texts, add_special_tokens=True)
    for row, ids in zip(batch["src"].tolist(), with_specials):
        assert row[: len(ids)] == ids and set(row[len(ids) :]) <= {joint.pad_id}
    for row, ids in zip(batch["tgt"].tolist(), with_specials):  # <bos> = the decoder start
        assert row[: len(ids) + 1] == [joint.bos_id, *ids]


def test_separate_vocabularies_write_a_target_file(lines, tmp_path):
    src, tgt = lines
    tok = Tokenizer.train([src], [tgt], vocab_size=600, joint=False, src_lang="en", tgt_lang="de")
    tok.save(tmp_path)
    assert (tmp_path / TARGET_FILENAME).is_file()
    (tmp_path / TARGET_FILENAME).unlink()
    with pytest.raises(
        FileNotFoundError, match=r"separate but .*target_tokenizer\.json is missing"
    ):
        Tokenizer.load(tmp_path)
    other = Tokenizer.train([src[:40]], [tgt[:40]], vocab_size=300, joint=False)
    other.save(tmp_path / "other")
    (tmp_path / "other" / META_FILENAME).replace(tmp_path / META_FILENAME)
    tok.save(tmp_path / "again")
    (tmp_path / "again" / TARGET_FILENAME).replace(tmp_path / TARGET_FILENAME)
    with pytest.raises(ValueError, match=r"describes vocabularies of sizes .* different runs"):
        Tokenizer.load(tmp_path)


def test_a_bare_standard_file_loads_as_joint(joint, tmp_path):
    (tmp_path / FILENAME).write_text(joint.src.to_str(), encoding="utf-8")
    loaded = Tokenizer.load(tmp_path / FILENAME)
    assert loaded.joint and loaded.src_lang is None
    assert loaded.encode_batch(["A dog."]) == joint.encode_batch(["A dog."])


def test_old_one_file_run_directory_and_checkpoint_still_load(tmp_path):
    import shutil

    from transformer_mt.checkpoint import load_model

    run = tmp_path / "run"
    shutil.copytree(FIXTURE_V1, run)
    old_text = (run / FILENAME).read_text(encoding="utf-8")
    assert json.loads(old_text)["format"] == "transformer_mt.tokenizer"  # really the old format
    assert json.loads(old_text)["src"]["post_processor"] is None
    from_dir = Tokenizer.load(run)
    assert (from_dir.src_lang, from_dir.tgt_lang, from_dir.joint) == ("en", "de", True)
    loaded = load_model(run / "model.ckpt")
    texts = ["A man runs.", "Zwei Hunde."]
    bare = loaded.tokenizer.encode_batch(texts)
    assert bare == from_dir.encode_batch(texts)
    assert loaded.tokenizer.encode_batch(texts, add_special_tokens=True) == [
        [*ids, 2] for ids in bare
    ]
    # Saving it again writes the standard files, which load to the same ids.
    loaded.tokenizer.save(tmp_path / "new")
    assert Tokenizer.load(tmp_path / "new").encode_batch(texts) == bare
