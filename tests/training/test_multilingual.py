"""One model for several directions: training, per-direction validation, the checkpoint."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from conftest import (
    FILES_TRAIN,
    MULTI30K,
    compose_train,
    load_script,
    train_multi_run,
    write_unequal_directions,
)


@pytest.fixture(scope="module")
def multi_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return train_multi_run(tmp_path_factory.mktemp("multi"))


def test_validation_scores_each_direction_and_their_mean(multi_run: Path) -> None:
    with open(next(multi_run.rglob("metrics.csv")), newline="") as f:
        rows = [r for r in csv.DictReader(f) if r.get("val/bleu")]
    assert len(rows) == 2
    for row in rows:
        per = [float(row[f"val/bleu/{d}"]) for d in ("en-de", "en-fr")]
        assert float(row["val/bleu"]) == pytest.approx(sum(per) / 2, abs=1e-4)
        assert row["val/chrf/en-de"] and row["val/bleu_tok/en-fr"]
    with open(next(multi_run.rglob("metrics.csv")), newline="") as f:
        test_rows = [r for r in csv.DictReader(f) if r.get("test/bleu")]
    assert test_rows and test_rows[0]["test/bleu/en-fr"]


def test_the_checkpoint_knows_its_directions_and_tags(multi_run: Path) -> None:
    from transformer_mt.checkpoint import load_model

    loaded = load_model(multi_run / "checkpoints" / "last.ckpt")
    assert loaded.data["directions"] == ["en-de", "en-fr"]
    assert loaded.tokenizer.target_languages == ["de", "fr"]
    assert (loaded.src_lang, loaded.tgt_lang) == ("en", "mul")


def test_evaluate_reports_each_direction(multi_run: Path, tmp_path: Path) -> None:
    from conftest import evaluate

    results = evaluate(tmp_path, f"ckpt_path={multi_run / 'checkpoints' / 'last.ckpt'}")
    per = results["directions"]
    assert sorted(per) == ["en-de", "en-fr"]
    assert per["en-de"]["n_sentences"] == per["en-fr"]["n_sentences"] == 30
    mean = (per["en-de"]["metrics"]["bleu"] + per["en-fr"]["metrics"]["bleu"]) / 2
    assert results["metrics"]["bleu"] == pytest.approx(mean)
    # The record of such an evaluation keeps each direction's metrics beside the means.
    record_main = load_script("record_run").main
    args = [str(multi_run), "--name", "multi", "--out", str(tmp_path / "runs")]
    assert record_main([*args, "--eval", f"greedy={tmp_path / 'results.json'}"]) == 0
    record = json.loads((tmp_path / "runs" / "multi.json").read_text(encoding="utf-8"))
    kept = record["evaluations"]["greedy"]["directions"]
    assert sorted(kept) == ["en-de", "en-fr"]
    assert kept["en-fr"]["bleu"] == round(per["en-fr"]["metrics"]["bleu"], 2)


def test_translate_picks_the_target_language_and_refuses_others(
    multi_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from transformer_mt.cli.translate import main as translate_main

    ckpt = str(multi_run / "checkpoints" / "last.ckpt")
    source = tmp_path / "in.en"
    source.write_text("one house 3\ntwo tree 4\n", encoding="utf-8")
    outputs = {}
    for lang in ("de", "fr"):
        out = tmp_path / f"out.{lang}"
        argv = ["--ckpt", ckpt, "--tgt-lang", lang, "-i", str(source), "-o", str(out), "-q"]
        assert translate_main(argv) == 0
        outputs[lang] = out.read_text(encoding="utf-8")
    assert outputs["de"].count("\n") == outputs["fr"].count("\n") == 2
    capsys.readouterr()
    for argv, words in (
        (["--tgt-lang", "cs"], "was not trained to translate into cs; it translates into de, fr"),
        ([], "translates into de, fr: choose one; e.g. --tgt-lang de"),
    ):
        code = translate_main(["--ckpt", ckpt, *argv, "-i", str(source), "-o", str(tmp_path / "x")])
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and len(err) == 1 and words in err[0], err
    assert not (tmp_path / "x").exists()


def test_score_and_serve_put_the_tag_in_front(multi_run: Path) -> None:
    from transformer_mt.checkpoint import load_model
    from transformer_mt.inference.score import score_pairs
    from transformer_mt.inference.translator import Translator
    from transformer_mt.serve.model import ServedModel

    ckpt = multi_run / "checkpoints" / "last.ckpt"
    loaded = load_model(ckpt)
    fr = Translator(loaded, tgt_lang="fr")
    de = Translator(loaded, tgt_lang="de")
    assert fr.encode(["one house"])[0][0] == loaded.tokenizer.tag_id("fr")
    pair = (["one house 3"], ["un maison 3"])
    assert score_pairs(fr, *pair)[0].token_log_probs != score_pairs(de, *pair)[0].token_log_probs
    served = ServedModel.open(ckpt, tgt_lang="fr")
    assert served.info()["tgt_lang"] == "fr"
    assert served.info()["target_languages"] == ["de", "fr"]
    assert served.translator.translate(["one house 3"]) == fr.translate(["one house 3"])


def test_an_ensemble_of_a_multilingual_and_a_bilingual_checkpoint_is_one_line(
    multi_run: Path, tiny_run_dir: Path
) -> None:
    from transformer_mt.checkpoint import CheckpointError, load_model
    from transformer_mt.inference.engine import check_ensemble

    from conftest import best_checkpoint

    pair = [
        load_model(multi_run / "checkpoints" / "last.ckpt"),
        load_model(best_checkpoint(tiny_run_dir)),
    ]
    with pytest.raises(CheckpointError, match=r"is multilingual \(into de, fr\) and"):
        check_ensemble(pair)


@pytest.mark.parametrize(
    ("preset", "directions"),
    [
        ("multi30k_many_en", ["de-en", "fr-en", "cs-en"]),
        ("multi30k_en_many", ["en-de", "en-fr", "en-cs"]),
    ],
)
def test_the_presets_compose(preset: str, directions: list[str], tmp_path: Path) -> None:
    from hydra.utils import instantiate

    cfg = compose_train(tmp_path / "run", [f"experiment={preset}"])
    data = instantiate(cfg.data)
    assert data.directions == directions and data.source == "files"
    assert data.name == preset


@pytest.mark.slow
@pytest.mark.skipif(not MULTI30K.is_dir(), reason=f"needs the Multi30k files in {MULTI30K}")
def test_the_many_to_english_preset_trains_on_multi30k(tmp_path: Path) -> None:
    """Two steps of the shipped preset on the real files: data, tags, BPE and model fit."""
    from transformer_mt.checkpoint import load_model
    from transformer_mt.training.run import run

    run_dir = tmp_path / "run"
    run(
        compose_train(
            run_dir,
            [
                "experiment=multi30k_many_en",
                "trainer.max_time=null",
                "trainer.max_steps=2",
                "trainer.limit_val_batches=0",  # a step budget ends validated: not needed here
                "test_after_fit=false",
                "data.cache_dir=null",
                "trainer.precision=32-true",
                "threads=2",
            ],
        )
    )
    loaded = load_model(run_dir / "checkpoints" / "last.ckpt")
    assert loaded.tokenizer.target_languages == ["en"]


def test_the_exported_model_translates_into_the_tagged_language(
    multi_run: Path, tmp_path: Path
) -> None:
    """The Hugging Face export of a multilingual model: the tags are special tokens of its
    tokenizer (the tagged text encodes to our row), the card says how to choose, and generate
    gives our greedy output (the export itself checks the logits)."""
    pytest.importorskip("transformers")
    import torch
    import transformers

    from transformer_mt.checkpoint import load_model
    from transformer_mt.export.convert import export_huggingface
    from transformer_mt.inference.search import SearchConfig
    from transformer_mt.inference.translator import Translator

    ckpt = multi_run / "checkpoints" / "last.ckpt"
    out = export_huggingface(ckpt, tmp_path / "hf", force=True)
    card = (out / "README.md").read_text(encoding="utf-8")
    assert "## Target language" in card and "`<2fr>`" in card and "en-de, en-fr" in card
    tok = transformers.AutoTokenizer.from_pretrained(out)
    model = transformers.AutoModelForSeq2SeqLM.from_pretrained(out).eval()
    loaded = load_model(ckpt)
    ours = Translator(loaded, SearchConfig(beam_size=1), tgt_lang="fr")
    batch = tok(["<2fr> one house 3"], return_tensors="pt")
    assert batch["input_ids"][0, 0].item() == loaded.tokenizer.tag_id("fr")
    with torch.no_grad():
        theirs = model.generate(**batch, num_beams=1, max_new_tokens=12)[0, 1:].tolist()
    mine = ours.translate_ids(ours.encode(["one house 3"]))[0]
    # The caps differ (generate forces <eos> at its last step): compare before them.
    n = min(len(mine), len(theirs) - 1)
    assert n >= 5 and theirs[:n] == mine[:n]


def test_the_service_takes_the_target_language_per_request(multi_run: Path) -> None:
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from transformer_mt.inference.translator import Translator
    from transformer_mt.serve.app import create_app
    from transformer_mt.serve.model import ServedModel

    ckpt = multi_run / "checkpoints" / "last.ckpt"
    served = ServedModel.open(ckpt)  # no --tgt-lang: each request names its language
    with TestClient(create_app(served)) as client:
        assert client.get("/model").json()["target_languages"] == ["de", "fr"]
        for lang in ("de", "fr"):
            answer = client.post("/translate", json={"text": ["one house 3"], "tgt_lang": lang})
            assert answer.status_code == 200, answer.text
            want = Translator(served.loaded, tgt_lang=lang).translate(["one house 3"])
            assert answer.json()["translations"] == want
        for body, words in (
            ({"text": ["one"], "tgt_lang": "cs"}, "is not a language this model translates"),
            ({"text": ["one"]}, "translates into de, fr: set tgt_lang"),
        ):
            answer = client.post("/translate", json=body)
            assert answer.status_code == 422 and words in answer.json()["error"], answer.text
        maps = client.post("/attention", json={"text": "one house 3", "tgt_lang": "fr"})
        assert maps.status_code == 200, maps.text


def test_ctranslate2_decodes_a_multilingual_model_as_torch_does(
    multi_run: Path, tmp_path: Path
) -> None:
    pytest.importorskip("ctranslate2")
    from transformer_mt.checkpoint import load_model
    from transformer_mt.export.convert import export_ctranslate2, export_huggingface
    from transformer_mt.inference.ctranslate2_engine import CTranslate2Engine
    from transformer_mt.inference.search import SearchConfig
    from transformer_mt.inference.translator import Translator

    ckpt = multi_run / "checkpoints" / "last.ckpt"
    ct2_dir = export_ctranslate2(export_huggingface(ckpt, tmp_path / "hf"), tmp_path / "ct2")
    loaded = load_model(ckpt)
    engine = CTranslate2Engine(ct2_dir, tokenizer=loaded.tokenizer)
    search = SearchConfig(beam_size=1)
    lines = ["one house 3", "two tree 4"]
    for lang in ("de", "fr"):
        ours = Translator(loaded, search, tgt_lang=lang).translate(lines)
        theirs = Translator(loaded, search, engine=engine, tgt_lang=lang).translate(lines)
        assert theirs == ours


def test_each_epoch_trains_on_its_own_draw_of_the_directions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With data.direction_temperature=5 the real Trainer reloads the training loader every
    epoch, and each epoch's loader holds the draw made for that epoch."""
    from transformer_mt.data.datamodule import TranslationDataModule
    from transformer_mt.training.run import run

    drawn: list[int] = []
    examples = TranslationDataModule.epoch_examples

    def recording(self, epoch):
        drawn.append(epoch)
        return examples(self, epoch)

    monkeypatch.setattr(TranslationDataModule, "epoch_examples", recording)
    corpus = write_unequal_directions(tmp_path / "corpus")
    overrides = [o for o in FILES_TRAIN if not o.startswith("trainer.max_epochs")]
    run_dir = tmp_path / "run"
    run(
        compose_train(
            run_dir,
            [
                *overrides, f"data.dir={corpus}", "data.max_len=32", "trainer.max_epochs=3",
                "data.directions=[de-en,fr-en]", "data.direction_temperature=5",
            ],
        )
    )  # fmt: skip
    assert sorted(set(drawn)) == [0, 1, 2]
    with open(next(run_dir.rglob("metrics.csv")), newline="") as f:
        rows = list(csv.DictReader(f))
    assert {r["epoch"] for r in rows if r.get("val/bleu/fr-en")} == {"0", "1", "2"}
