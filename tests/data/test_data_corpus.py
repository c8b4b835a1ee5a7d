"""Corpora: local files in every layout, the generated task, bad data, the Hub offline."""

from __future__ import annotations

import gzip
import json
import socket
from pathlib import Path

import pytest

from transformer_mt.data.config import DataConfig
from transformer_mt.data.sources import (
    generate_numbers_corpus,
    hub,
    load_corpus,
    load_files_corpus,
    load_hub_corpus,
)

from conftest import MULTI30K

needs_multi30k = pytest.mark.skipif(
    not (MULTI30K / "train.en.gz").is_file(), reason=f"Multi30k copy not found at {MULTI30K}"
)

PAIRS = {
    "train": [("A dog runs.", "Ein Hund rennt."), ("Two men.", "Zwei Männer."), ("Hi", "Hallo")],
    "val": [("A cat.", "Eine Katze.")],
    "test": [("The sun.", "Die Sonne."), ("Blue.", "Blau.")],
}
PREFIXES = {"train": "train", "validation": "val", "test": "test"}


def write_parallel(directory: Path, gz: bool = False) -> None:
    """Write PAIRS as {prefix}.en / {prefix}.de (optionally gzipped)."""
    for prefix, pairs in PAIRS.items():
        for lang, column in (("en", 0), ("de", 1)):
            text = "".join(pair[column] + "\n" for pair in pairs).encode()
            path = directory / f"{prefix}.{lang}"
            if gz:
                path.with_suffix(path.suffix + ".gz").write_bytes(gzip.compress(text))
            else:
                path.write_bytes(text)


def as_pairs(split) -> list[tuple[str, str]]:
    return list(zip(split["src"], split["tgt"]))


# ----------------------------------------------------------------- local files


@needs_multi30k
def test_multi30k_files_load_all_splits_with_expected_sizes():
    data = load_files_corpus(MULTI30K, "en", "de")
    assert {k: len(v) for k, v in data.items()} == {
        "train": 29000,
        "validation": 1014,
        "test": 1000,
    }
    assert data["train"].column_names == ["src", "tgt"]
    assert (
        data["validation"][0]["tgt"] == "Eine Gruppe von Männern lädt Baumwolle auf einen Lastwagen"
    )


@needs_multi30k
def test_multi30k_other_language_and_split_prefix_override():
    data = load_corpus(
        DataConfig(
            source="files",
            dir=str(MULTI30K),
            src_lang="en",
            tgt_lang="fr",
            prefixes={"train": "val", "validation": "val", "test": "test_2016_flickr"},
        )
    )
    assert len(data["train"]) == 1014 and len(data["test"]) == 1000
    with pytest.raises(FileNotFoundError, match=r"test_2017_flickr\.en"):
        load_files_corpus(MULTI30K, "en", "de", prefixes={"test": "test_2017_flickr"})


@pytest.mark.parametrize("gz", [False, True])
def test_parallel_files_plain_and_gzip(tmp_path, gz):
    write_parallel(tmp_path, gz=gz)
    data = load_files_corpus(tmp_path, "en", "de", prefixes=PREFIXES)
    assert as_pairs(data["train"]) == PAIRS["train"]
    assert as_pairs(data["validation"]) == PAIRS["val"]
    assert as_pairs(data["test"]) == PAIRS["test"]


def test_tsv_and_jsonl_layouts(tmp_path):
    (tmp_path / "train.tsv").write_text("".join(f"{s}\t{t}\n" for s, t in PAIRS["train"]))
    with gzip.open(tmp_path / "val.jsonl.gz", "wt") as f:  # language keys, gzipped
        f.writelines(json.dumps({"en": s, "de": t}) + "\n" for s, t in PAIRS["val"])
    (tmp_path / "test.jsonl").write_text(
        "".join(
            json.dumps({"src": s, "tgt": t}, ensure_ascii=False) + "\n" for s, t in PAIRS["test"]
        )
    )
    data = load_files_corpus(tmp_path, "en", "de", prefixes=PREFIXES)  # file_format="auto"
    assert as_pairs(data["train"]) == PAIRS["train"]
    assert as_pairs(data["validation"]) == PAIRS["val"]
    assert as_pairs(data["test"]) == PAIRS["test"]


def test_extra_split_via_prefixes(tmp_path):
    write_parallel(tmp_path)
    data = load_files_corpus(tmp_path, "en", "de", prefixes={**PREFIXES, "test2": "val"})
    assert as_pairs(data["test2"]) == PAIRS["val"]


# -------------------------------------------------------------------- bad data


def test_missing_directory_names_path_and_fix(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"nowhere.*data\.dir="):
        load_files_corpus(tmp_path / "nowhere", "en", "de")


def test_missing_file_names_path(tmp_path):
    write_parallel(tmp_path)
    (tmp_path / "test.de").unlink()
    with pytest.raises(FileNotFoundError, match=r"test\.de"):
        load_files_corpus(tmp_path, "en", "de", prefixes=PREFIXES)


def test_line_count_mismatch_names_both_files_and_counts(tmp_path):
    write_parallel(tmp_path)
    (tmp_path / "train.de").write_text("Ein Hund rennt.\nZwei Männer.\n")
    with pytest.raises(ValueError, match=r"train\.en has 3 lines.*train\.de has 2"):
        load_files_corpus(tmp_path, "en", "de", prefixes=PREFIXES)


def test_empty_split_is_an_error(tmp_path):
    write_parallel(tmp_path)
    (tmp_path / "val.en").write_text("")
    (tmp_path / "val.de").write_text("")
    with pytest.raises(ValueError, match=r"'validation' is empty"):
        load_files_corpus(tmp_path, "en", "de", prefixes=PREFIXES)


def test_undecodable_bytes_name_file_and_line(tmp_path):
    write_parallel(tmp_path)
    (tmp_path / "train.de").write_bytes(b"Ein Hund.\nZwei M\xe4nner.\nHallo\n")  # latin-1 ä
    with pytest.raises(ValueError, match=r"train\.de, line 2: not valid UTF-8"):
        load_files_corpus(tmp_path, "en", "de", prefixes=PREFIXES)


def test_bad_tsv_and_jsonl_rows_name_file_and_line(tmp_path):
    (tmp_path / "a.tsv").write_text("one\tein\ntwo only\n")
    with pytest.raises(ValueError, match=r"a\.tsv, line 2: expected 2 tab-separated"):
        load_files_corpus(tmp_path, "en", "de", prefixes={"train": "a"})
    (tmp_path / "b.jsonl").write_text('{"en": "x", "fr": "y"}\n')
    with pytest.raises(ValueError, match=r"b\.jsonl, line 1: expected keys"):
        load_files_corpus(tmp_path, "en", "de", prefixes={"train": "b"})


def test_files_source_without_dir_explains(tmp_path):
    with pytest.raises(ValueError, match=r"data\.dir"):
        load_corpus(DataConfig(source="files"))
    with pytest.raises(ValueError, match="Unknown corpus source"):
        DataConfig(source="ftp")


# ------------------------------------------------------------------- generated


def test_generated_numbers_are_deterministic_disjoint_and_real_language():
    sizes = {"train": 300, "validation": 50, "test": 50}
    kw = {"sizes": sizes, "number_range": (0, 999), "task": "numbers"}
    a = generate_numbers_corpus(**kw, seed=3)
    b = generate_numbers_corpus(**kw, seed=3)
    c = generate_numbers_corpus(**kw, seed=4)
    assert {k: len(v) for k, v in a.items()} == sizes
    for split in sizes:
        assert as_pairs(a[split]) == as_pairs(b[split])
    assert as_pairs(a["train"]) != as_pairs(c["train"])
    train, val, test = (set(a[s]["src"]) for s in ("train", "validation", "test"))
    assert not (train & val) and not (train & test) and not (val & test)
    pairs = dict(as_pairs(a["train"]) + as_pairs(a["validation"]) + as_pairs(a["test"]))
    assert pairs.get("four hundred and ninety-seven", "vierhundertsiebenundneunzig") == (
        "vierhundertsiebenundneunzig"
    )


def test_generated_french_target_and_range_check():
    data = generate_numbers_corpus(
        tgt_lang="fr",
        sizes={"train": 5, "validation": 1, "test": 1},
        number_range=(97, 103),
        task="numbers",
    )
    # 7 numbers from a range of 7: every number in 97..103 is used exactly once.
    targets = [t for split in data.values() for t in split["tgt"]]
    assert sorted(targets) == sorted(
        [
            *("quatre-vingt-dix-sept", "quatre-vingt-dix-huit", "quatre-vingt-dix-neuf"),
            *("cent", "cent un", "cent deux", "cent trois"),
        ]
    )
    with pytest.raises(ValueError, match=r"need 30 distinct numbers.*\[0, 9\] has 10"):
        generate_numbers_corpus(
            sizes={"train": 10, "validation": 10, "test": 10}, number_range=(0, 9)
        )


def test_generated_sentences_are_deterministic_disjoint_and_reordered():
    sizes = {"train": 200, "validation": 30, "test": 30}
    a = generate_numbers_corpus(sizes=sizes, number_range=(2, 9999), seed=1)
    b = generate_numbers_corpus(sizes=sizes, number_range=(2, 9999), seed=1)
    for split in sizes:
        assert as_pairs(a[split]) == as_pairs(b[split])
    train, val, test = (set(a[s]["src"]) for s in ("train", "validation", "test"))
    assert not (train & val) and not (train & test) and not (val & test)
    pairs = as_pairs(a["train"])
    # German puts the verb last in "dass" clauses: the reordering the model has to learn.
    clause = [(en, de) for en, de in pairs if en.startswith("I know that")]
    assert clause and all(
        de.startswith("Ich weiß, dass") and de.endswith(" hat.") for _, de in clause
    )
    assert all(len(de.split()) >= 4 for _, de in pairs)  # several words: BLEU has n-grams
    with pytest.raises(ValueError, match="no templates for 'cs'"):
        generate_numbers_corpus(sizes=sizes, tgt_lang="cs", number_range=(2, 9999))
    with pytest.raises(ValueError, match="Unknown generated task"):
        generate_numbers_corpus(sizes=sizes, task="poems")


# ------------------------------------------------------------------------- hub


@pytest.fixture
def no_network(monkeypatch):
    """Fail any attempt to open a socket, so a test can prove it stays offline."""

    def refuse(*args, **kwargs):
        raise AssertionError("network access attempted")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


def test_hub_offline_fails_at_once_with_files_hint(monkeypatch, tmp_path, no_network):
    import datasets
    import huggingface_hub

    # datasets reads HF_DATASETS_OFFLINE at import time; set the env and its constants.
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(
        ConnectionError, match=r"Hugging Face Hub.*data\.source=files data\.dir="
    ) as err:
        load_hub_corpus("bentrevett/multi30k", None, "en", "de", cache_dir=str(tmp_path))
    # Offline mode is already on: the message must not tell the user to turn it on.
    assert "Offline mode is on" in str(err.value)
    assert "set HF_DATASETS_OFFLINE=1" not in str(err.value)


def test_hub_unreachable_is_detected_before_load_dataset(monkeypatch, tmp_path):
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(hub.datasets.config, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(hub, "_hub_reachable", lambda timeout=3.0: False)

    def never(*args, **kwargs):
        raise AssertionError("load_dataset must not be called when the Hub is unreachable")

    monkeypatch.setattr(hub.datasets, "load_dataset", never)
    with pytest.raises(ConnectionError, match=r"no network connection.*HF_DATASETS_OFFLINE=1"):
        load_hub_corpus("wmt/wmt14", "de-en", "en", "de", cache_dir=str(tmp_path))


def test_hub_rows_flat_and_nested_become_src_tgt(monkeypatch):
    import datasets

    flat = datasets.DatasetDict(
        {s: datasets.Dataset.from_dict({"en": ["a"], "de": ["b"]}) for s in PREFIXES}
    )
    nested = datasets.DatasetDict(
        {
            s: datasets.Dataset.from_dict({"translation": [{"de": "b", "en": "a"}]})
            for s in ("train", "validation", "test")
        }
    )
    monkeypatch.setattr(hub, "_hub_reachable", lambda timeout=3.0: True)
    for raw in (flat, nested):
        monkeypatch.setattr(hub.datasets, "load_dataset", lambda *a, raw=raw, **k: raw)
        data = load_hub_corpus("x", None, "de", "en")
        assert as_pairs(data["test"]) == [("b", "a")]
