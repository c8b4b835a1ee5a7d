"""transformer-mt-export: the Hugging Face directory loads with the Auto classes and computes
what our model computes (logits to 1e-4, greedy and beam-5 token ids equal), CTranslate2 greedy
equals ours, and options no standard class represents are refused with the option's name.

The trained model is a tiny copy model trained here for a few seconds, once per session.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import stat
from pathlib import Path

import pytest
import torch

from transformer_mt.checkpoint import CHECKPOINT_KEY, load_checkpoint, load_model, save_checkpoint
from transformer_mt.cli.export import main
from transformer_mt.data.numbers import number_sentences
from transformer_mt.export.convert import export_ctranslate2, export_huggingface
from transformer_mt.export.huggingface import (
    LOGITS_TOLERANCE,
    ExportError,
    check_logits,
    choose_target,
    to_huggingface,
)
from transformer_mt.export.weights import feature_permutation
from transformer_mt.inference.decode import best_tokens
from transformer_mt.inference.search import SearchConfig
from transformer_mt.inference.translator import Translator
from transformer_mt.model.embedding import SinusoidalPositionalEncoding
from transformer_mt.model.transformer import ModelConfig, Transformer

from conftest import FIXTURES, ROOT, load_script, source_tensor, train_copy_model

transformers = pytest.importorskip("transformers", reason="needs the export extra")

FIXTURE_V1 = FIXTURES / "format_v1" / "model.ckpt"
#: One length cap for both sides (ours: max_len_a=0, max_len_b=CAP; generate: max_new_tokens).
CAP = 60


def sources(n: int = 12) -> list[str]:
    """English number sentences of numbers the model did not see (training uses multiples of 3)."""
    src, _ = number_sentences(list(range(101, 101 + 3 * n, 3)), "en", "de", seed=3)
    return src


@pytest.fixture(scope="session")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.manual_seed(0)
    tokenizer, model = train_copy_model()
    checkpoint = {
        "state_dict": {f"model.{k}": v for k, v in model.state_dict().items()},
        "global_step": 150,
        "epoch": 0,
        CHECKPOINT_KEY: {
            "format": 1,
            "model_config": model.config.to_dict(),
            "tokenizer": tokenizer.to_json(),
            "src_lang": "en",
            "tgt_lang": "de",
            "decoding": {"beam_size": 5, "length_penalty": 0.6},
            "data": {"name": "numbers_en_de"},
        },
    }
    return save_checkpoint(checkpoint, tmp_path_factory.mktemp("copy") / "model.ckpt")


@pytest.fixture(scope="session")
def hf_dir(ckpt: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    results = tmp_path_factory.mktemp("results") / "results.json"
    results.write_text(
        json.dumps(
            {
                "metrics": {"bleu": 12.34, "chrf": 45.6},
                "signature": {"bleu": "nrefs:1|case:mixed|tok:13a|version:2", "chrf": "chrF2"},
                "data": {"split": "test"},
            }
        )
    )
    return export_huggingface(ckpt, tmp_path_factory.mktemp("export") / "hf", results)


def ours_generate(model: Transformer, src: torch.Tensor, **search) -> torch.Tensor:
    """Our search's best outputs, ``<eos>``-ended and padded (ids 1/2 are bos/eos), as the
    benchmarks compare them with ``generate`` (scripts/bench/common.py)."""
    common = load_script("bench/common")
    return common.generate(model, src, bos_id=1, eos_id=2, search=SearchConfig(**search))


def strip(ids: torch.Tensor, pad: int = 0, bos: int = 1, eos: int = 2) -> list[list[int]]:
    """Generated ids without the start token, up to and including the first ``<eos>``
    (what follows is filler: ours pads, ``generate``'s beam search repeats ``<eos>``)."""
    rows = [[t for t in row if t not in (pad, bos)] for row in ids.tolist()]
    return [row[: row.index(eos) + 1] if eos in row else row for row in rows]


def random_checkpoint(path: Path, **overrides) -> Path:
    """The format-v1 fixture's tokenizer with a random model of ``overrides``' shape."""
    checkpoint = load_checkpoint(FIXTURE_V1)
    meta = checkpoint[CHECKPOINT_KEY]
    values = {**meta["model_config"], "n_encoder_layers": 2, "n_decoder_layers": 2, **overrides}
    model = Transformer(ModelConfig(**values))
    with torch.no_grad():  # no parameter at its init value (LayerNorm 1/0, zero biases)
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    meta["model_config"] = model.config.to_dict()
    checkpoint["state_dict"] = {f"model.{k}": v for k, v in model.state_dict().items()}
    return save_checkpoint(checkpoint, path)


# ----------------------------------------------------------------------------- layout


def test_permutation_maps_our_positions_to_the_standard_table() -> None:
    ours = SinusoidalPositionalEncoding(32, 64).pe
    marian = transformers.models.marian.modeling_marian.MarianSinusoidalPositionalEmbedding(64, 32)
    assert torch.allclose(ours[:, feature_permutation(32)], marian.create_weight(), atol=1e-5)
    assert not torch.allclose(ours, marian.create_weight(), atol=1e-2)  # the permutation matters


def test_directory_loads_with_the_auto_classes(hf_dir: Path, ckpt: Path) -> None:
    for name in ("config.json", "model.safetensors", "generation_config.json", "tokenizer.json"):
        assert (hf_dir / name).is_file(), name
    model = transformers.AutoModelForSeq2SeqLM.from_pretrained(hf_dir)
    tokenizer = transformers.AutoTokenizer.from_pretrained(hf_dir)
    assert type(model).__name__ == "MarianMTModel"  # the copy model is post-LN
    ours = load_model(ckpt)
    texts = sources(4)
    assert tokenizer(texts)["input_ids"] == ours.tokenizer.encode_batch(
        texts, add_special_tokens=True
    )
    generation = json.loads((hf_dir / "generation_config.json").read_text())
    decoding = ours.decoding
    assert generation["num_beams"] == decoding.get("beam_size", 4)
    if generation["num_beams"] > 1:
        assert generation["length_penalty"] == decoding.get("length_penalty", 0.6)
    assert generation["decoder_start_token_id"] == ours.tokenizer.bos_id
    assert json.loads((hf_dir / "tokenizer_config.json").read_text())["tokenizer_class"] == (
        "PreTrainedTokenizerFast"
    )
    card = (hf_dir / "README.md").read_text()
    assert "en -> de" in card and "12.34" in card and "tok:13a" in card
    assert "numbers_en_de" in card
    assert json.loads((hf_dir / "results.json").read_text())["metrics"]["bleu"] == 12.34


# ----------------------------------------------------------------------------- exactness


@pytest.fixture(scope="module")
def exported(hf_dir: Path, ckpt: Path):
    model = transformers.AutoModelForSeq2SeqLM.from_pretrained(hf_dir).eval()
    return load_model(ckpt), model


def test_logits_match_ours(exported) -> None:
    ours, theirs = exported
    texts = sources()
    src = source_tensor(ours.tokenizer, texts)
    tgt = source_tensor(ours.tokenizer, number_sentences(list(range(5, 65, 5)), "en", "de", 1)[1])
    tgt_in = torch.cat([torch.ones_like(tgt[:, :1]), tgt[:, :-1]], dim=1)  # <bos> + German
    with torch.no_grad():
        a = ours.model(src, tgt_in)
        b = theirs(input_ids=src, attention_mask=src != 0, decoder_input_ids=tgt_in).logits
    assert a.shape == b.shape
    assert float((a - b).abs().max()) < LOGITS_TOLERANCE


@pytest.mark.parametrize("beam", [1, 5])
def test_generate_returns_our_token_ids(exported, beam: int) -> None:
    ours, theirs = exported
    texts = sources()
    src = source_tensor(ours.tokenizer, texts)
    if beam == 1:
        mine = ours_generate(ours.model, src, max_len_a=0, max_len_b=CAP)
    else:  # alpha 0: both rank finished hypotheses by log-probability alone
        mine = ours_generate(
            ours.model, src, beam_size=beam, length_penalty=0.0, max_len_a=0, max_len_b=CAP
        )
    with torch.no_grad():
        hf = theirs.generate(
            input_ids=src,
            attention_mask=src != 0,
            num_beams=beam,
            length_penalty=0.0,
            max_new_tokens=CAP,
            do_sample=False,
        )
    mine_ids, hf_ids = strip(mine), strip(hf)
    # The model is trained: sentences end well before the cap, so the cap conventions
    # (ours keeps log p(eos) at the cap, generate forces it with score 0) play no part.
    assert all(row[-1] == 2 and len(row) < CAP for row in mine_ids)
    assert mine_ids == hf_ids


def test_pre_ln_exports_as_pegasus_with_equal_logits_and_greedy_ids(tmp_path: Path) -> None:
    ckpt = random_checkpoint(tmp_path / "pre.ckpt", norm_first=True, activation="gelu")
    loaded = load_model(ckpt)
    assert choose_target(loaded.config).architecture == "PegasusForConditionalGeneration"
    hf, _ = to_huggingface(loaded)
    assert check_logits(loaded, hf, sources(5)) < LOGITS_TOLERANCE
    src = source_tensor(loaded.tokenizer, sources(5))
    mine = ours_generate(loaded.model, src, max_len_a=0, max_len_b=12)
    with torch.no_grad():
        theirs = hf.generate(input_ids=src, attention_mask=src != 0, num_beams=1, max_new_tokens=12)
    assert strip(mine) == strip(theirs)  # random weights run to the cap: both force <eos> there


def test_untied_separate_embeddings_export_exactly(tmp_path: Path) -> None:
    ckpt = random_checkpoint(
        tmp_path / "untied.ckpt", tie_embeddings=False, share_encoder_decoder_embeddings=False
    )
    loaded = load_model(ckpt)
    hf, _ = to_huggingface(loaded)
    assert not hf.config.share_encoder_decoder_embeddings and not hf.config.tie_word_embeddings
    assert check_logits(loaded, hf, sources(5)) < LOGITS_TOLERANCE


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        ({"positional": "learned"}, "model.positional=learned"),
        ({"d_k": 4, "d_v": 4}, "model.d_k=4"),
        ({"norm_first": True, "share_encoder_decoder_embeddings": False}, "share_encoder_decoder"),
    ],
)
def test_unrepresentable_options_are_named(tmp_path: Path, overrides, named, capsys) -> None:
    ckpt = random_checkpoint(tmp_path / "odd.ckpt", **overrides)
    with pytest.raises(ExportError, match=named):
        to_huggingface(load_model(ckpt))
    assert main(["--ckpt", str(ckpt), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and named in err[0]
    assert not (tmp_path / "out").exists()


def test_cli_refuses_a_non_empty_out_dir(tmp_path: Path, capsys) -> None:
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("mine")
    assert main(["--ckpt", str(FIXTURE_V1), "--out", str(tmp_path / "out")]) == 2
    assert "--force" in capsys.readouterr().err
    assert (tmp_path / "out" / "keep.txt").read_text() == "mine"


def test_force_replaces_a_previous_export_only(tmp_path: Path, capsys) -> None:
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "keep.txt").write_text("mine")
    assert main(["--ckpt", str(FIXTURE_V1), "--out", str(tmp_path / "mine"), "--force"]) == 2
    assert "is not a previous export" in capsys.readouterr().err
    assert [p.name for p in (tmp_path / "mine").iterdir()] == ["keep.txt"]
    # An out directory that holds the checkpoint is refused before any work.
    run = tmp_path / "run" / "checkpoints"
    run.mkdir(parents=True)
    ckpt = run / "best.ckpt"
    ckpt.write_bytes(FIXTURE_V1.read_bytes())
    assert main(["--ckpt", str(ckpt), "--out", str(run), "--force"]) == 2
    assert f"--out {run} contains the --ckpt {ckpt}" in capsys.readouterr().err
    assert [p.name for p in run.iterdir()] == ["best.ckpt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine", "run"]  # no staging debris


def test_force_replaces_a_previous_export(ckpt: Path, tmp_path: Path) -> None:
    out = tmp_path / "exported"
    export_huggingface(ckpt, out)
    assert (out / ".transformer-mt-export").is_file()
    assert oct(out.stat().st_mode & 0o777) == oct(0o777 & ~_umask())
    (out / "stale.txt").write_text("from the previous export's day")
    export_huggingface(ckpt, out, force=True)
    assert not (out / "stale.txt").exists() and (out / "config.json").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["exported"]


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# ----------------------------------------------------------------------------- as a user finds it


@pytest.fixture(scope="module")
def beam_export(ckpt: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The copy model stored with beam 5 at length penalty 0, exported: (checkpoint, dir).

    The output cap is CAP for every sentence, which all outputs end before (see above): at the
    cap itself the conventions differ (ours keeps log p(eos), generate forces it).
    """
    checkpoint = load_checkpoint(ckpt)
    checkpoint[CHECKPOINT_KEY]["decoding"] = {
        "beam_size": 5,
        "length_penalty": 0.0,
        "max_len_a": 0.0,
        "max_len_b": CAP,
    }
    checkpoint[CHECKPOINT_KEY]["data"] = {"name": "numbers_en_de", "max_len": 20}
    checkpoint["callbacks"] = {
        "ModelCheckpoint{'monitor': 'val/bleu'}": {"monitor": "val/bleu", "current_score": 12.5}
    }
    where = tmp_path_factory.mktemp("beam")
    beam_ckpt = save_checkpoint(checkpoint, where / "beam.ckpt")
    return beam_ckpt, export_huggingface(beam_ckpt, where / "hf")


def test_the_cards_snippet_translates_as_we_do(beam_export, capsys) -> None:
    """The card's code, run as printed on the installed transformers: our stored decoding."""
    beam_ckpt, hf = beam_export
    card = (hf / "README.md").read_text()
    code, _steering = re.findall(r"```python\n(.*?)```", card, flags=re.S)
    texts = sources(6)
    code = code.replace('"path/to/this/directory"', repr(str(hf)))
    code = code.replace('["A man in an orange hat."]', repr(texts))
    capsys.readouterr()
    exec(compile(code, "README.md", "exec"), {})
    printed = ast.literal_eval(capsys.readouterr().out.strip())
    assert printed == Translator(load_model(beam_ckpt)).translate(texts)
    assert "num_beams=5, early_stopping=True, length_penalty=0.0" in code


def _card_code(card: str, directory: Path, texts: list[str]) -> str:
    """The card's Python snippets, one program, pointed at ``directory`` and ``texts``."""
    code = "\n".join(re.findall(r"```python\n(.*?)```", card, flags=re.S))
    code = code.replace('"path/to/this/directory"', repr(str(directory)))
    return code.replace('["A man in an orange hat."]', repr(texts))


def test_the_cards_steering_snippet_samples_and_forces_a_prefix(beam_export, capsys) -> None:
    """Sampling gives two outputs per source and the forced start begins the output."""
    card = (beam_export[1] / "README.md").read_text()
    texts = sources(2)
    capsys.readouterr()
    exec(compile(_card_code(card, beam_export[1], texts), "README.md", "exec"), {})
    printed = [ast.literal_eval(line) for line in capsys.readouterr().out.strip().splitlines()]
    plain, samples, forced = printed
    assert len(plain) == 2 and len(samples) == 4
    assert forced[0].startswith("Ein Mann")


def test_the_ctranslate2_cards_snippet_translates_as_we_do(hf_dir, ckpt, tmp_path, capsys):
    """The CTranslate2 card's code, run as printed: our greedy translations."""
    pytest.importorskip("ctranslate2", reason="needs the export extra")
    ct2 = export_ctranslate2(hf_dir, tmp_path / "ct2")
    texts = sources(4)
    capsys.readouterr()
    exec(compile(_card_code((ct2 / "README.md").read_text(), ct2, texts), "card", "exec"), {})
    printed = ast.literal_eval(capsys.readouterr().out.strip())
    ours = Translator(load_model(ckpt), SearchConfig(max_len_a=0, max_len_b=CAP))
    assert printed == ours.translate(texts)


def test_card_names_the_licence_and_the_recorded_validation_bleu(beam_export) -> None:
    card = (beam_export[1] / "README.md").read_text()
    assert "license: mit" in card and "## Licence" in card
    assert "| bleu (validation, during training) | 12.50 |" in card
    assert "https://github.com/)" not in card  # no placeholder link
    assert "pipeline(" not in card  # transformers 5 has no translation pipeline


def test_tokenizer_cuts_sources_where_our_translator_does(beam_export) -> None:
    beam_ckpt, hf = beam_export
    tokenizer = transformers.AutoTokenizer.from_pretrained(hf)
    translator = Translator(load_model(beam_ckpt))
    assert translator.limit == 20  # the stored data.max_len
    assert tokenizer.model_max_length == translator.limit + 1  # + <eos>
    long = " ".join(sources(12))
    ids = tokenizer([long], truncation=True)["input_ids"][0]
    (ours,) = translator.encode([long], where="test")
    assert ids == [*ours, 2]


def test_exported_files_are_readable_by_everyone(beam_export) -> None:
    umask = _umask()
    files = [p for p in beam_export[1].rglob("*") if p.is_file()]
    assert any(p.name == "model.safetensors" for p in files)
    for path in files:
        assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~umask, path


# ----------------------------------------------------------------------------- CTranslate2


@pytest.fixture(scope="module")
def ct2_dir(hf_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("ctranslate2", reason="needs the export extra")
    return export_ctranslate2(hf_dir, tmp_path_factory.mktemp("ct2") / "model")


def test_ctranslate2_greedy_equals_ours(ct2_dir: Path, ckpt: Path) -> None:
    from transformer_mt.inference.ctranslate2_engine import CTranslate2Engine

    ours = load_model(ckpt)
    search = SearchConfig(beam_size=1)
    engine = CTranslate2Engine(ct2_dir, threads=1)
    mine, theirs = Translator(ours, search), Translator(ours, search, engine=engine)
    texts = sources()
    ids = mine.encode(texts)
    expected = strip(ours_generate(ours.model, source_tensor(ours.tokenizer, texts)))
    expected = [row[:-1] for row in expected]  # without <eos>
    assert theirs.translate_ids(ids) == mine.translate_ids(ids) == expected
    assert theirs.translate(texts) == ours.tokenizer.decode_hypotheses(expected)
    # A collated batch (the decode loop's input), with an empty source: empty output.
    src = source_tensor(ours.tokenizer, texts)
    empty = torch.zeros(1, src.size(1), dtype=torch.long)
    empty[0, 0] = 2
    batch = {"src": torch.cat([src, empty])}
    assert best_tokens(engine.decode_batch(batch, search)) == [*expected, []]
    # A tight per-sentence cap cuts like ours does (max_len_a * source length + max_len_b).
    tight = SearchConfig(beam_size=1, max_len_a=0.3, max_len_b=1)
    assert best_tokens(theirs.decode_ids(ids, tight)) == best_tokens(mine.decode_ids(ids, tight))


def test_ctranslate2_refuses_a_model_with_another_tokenizer(ct2_dir: Path, ckpt: Path) -> None:
    from transformer_mt.inference.ctranslate2_engine import CTranslate2Engine

    other = load_model(FIXTURE_V1).tokenizer
    with pytest.raises(ExportError) as err:
        CTranslate2Engine(ct2_dir, tokenizer=other)
    assert f"the CTranslate2 model {ct2_dir} was exported from a checkpoint with another " in (
        str(err.value)
    )
    assert "(checkpoint vs model: " in str(err.value)
    with pytest.raises(ExportError, match="unknown compute type 'int3'; on cpu CTranslate2 runs"):
        CTranslate2Engine(ct2_dir, compute_type="int3")
    own = CTranslate2Engine(ct2_dir, tokenizer=load_model(ckpt).tokenizer)
    assert own.tokenizer.difference(load_model(ckpt).tokenizer) is None


def test_ctranslate2_nbest_and_scores_agree_with_ours(ct2_dir: Path, ckpt: Path) -> None:
    """n-best lists of the same length whose top hypothesis is ours (beam 5, alpha 0), and
    scores that agree: the search's (alpha 0: log-probabilities) and forced decoding's."""
    from transformer_mt.inference.ctranslate2_engine import CTranslate2Engine

    ours = load_model(ckpt)
    search = SearchConfig(beam_size=5, length_penalty=0.0, nbest=3)
    mine = Translator(ours, search)
    theirs = Translator(ours, search, engine=CTranslate2Engine(ct2_dir, threads=1))
    ids = mine.encode(sources())
    a, b = mine.decode_ids(ids), theirs.decode_ids(ids)
    assert [len(h) for h in a] == [len(h) for h in b] == [3] * len(ids)
    assert best_tokens(a) == best_tokens(b)
    for x, y in zip(a, b):
        per_token = abs(x[0].score - y[0].score) / (len(x[0].tokens) + 1)
        assert per_token < 1e-3
    targets = [hyps[-1].tokens for hyps in a]  # the third best: not what greedy would say
    for x, y in zip(mine.score_ids(ids, targets), theirs.score_ids(ids, targets)):
        assert len(x) == len(y)
        assert max(abs(p - q) for p, q in zip(x, y)) < 1e-3


def test_ctranslate2_int8_runs(ct2_dir: Path, ckpt: Path) -> None:
    from transformer_mt.inference.ctranslate2_engine import CTranslate2Engine

    engine = CTranslate2Engine(ct2_dir, compute_type="int8")
    translator = Translator(load_model(ckpt), SearchConfig(beam_size=5), engine=engine)
    out = translator.translate(sources(6))
    assert len(out) == 6 and all(line.strip() for line in out)


def test_cli_writes_an_int8_ctranslate2_model(ckpt: Path, tmp_path: Path) -> None:
    pytest.importorskip("ctranslate2", reason="needs the export extra")
    out = tmp_path / "ct2"
    args = ["--ckpt", str(ckpt), "--out", str(out), "--format", "ctranslate2"]
    assert main([*args, "--quantization", "int8"]) == 0
    assert (out / "model.bin").is_file() and (out / "transformer_mt" / "tokenizer.json").is_file()
    assert not list(tmp_path.glob(".*"))  # no staging directories left behind
    shutil.rmtree(out)


def test_evaluate_and_translate_decode_with_ctranslate2(
    ckpt: Path, ct2_dir: Path, tmp_path: Path
) -> None:
    from hydra import compose, initialize_config_dir

    from transformer_mt.cli.evaluate import evaluate as evaluate_run
    from transformer_mt.cli.translate import main as translate_main

    texts = sources(8)
    src = tmp_path / "in.en"
    src.write_text("".join(t + "\n" for t in [*texts[:4], "", *texts[4:]]), encoding="utf-8")
    outputs = {}
    for engine in ("torch", "ctranslate2"):
        out = tmp_path / f"{engine}.de"
        extra = ["--engine", engine, "--ct2-model", str(ct2_dir)] if engine != "torch" else []
        assert translate_main(["--ckpt", str(ckpt), "-i", str(src), "-o", str(out), "--greedy",
                               *extra]) == 0  # fmt: skip
        outputs[engine] = out.read_text(encoding="utf-8").split("\n")
    assert outputs["ctranslate2"] == outputs["torch"] and outputs["torch"][4] == ""
    configs = str(ROOT / "configs")
    results = {}
    for engine in ("torch", "ctranslate2"):
        overrides = [f"run_dir={tmp_path / engine}", "progress=false", f"ckpt_path={ckpt}",
                     f"source_file={src}", f"reference_file={src}", "decoding.beam_size=1",
                     f"engine={engine}", f"engine_model={ct2_dir}"]  # fmt: skip
        with initialize_config_dir(config_dir=configs, version_base="1.3"):
            results[engine] = evaluate_run(compose("evaluate", overrides=overrides))
    assert results["ctranslate2"]["decoding"]["engine"] == "ctranslate2"
    assert results["ctranslate2"]["metrics"] == results["torch"]["metrics"]
    hyps = [Path(results[e]["hypotheses_path"]).read_text(encoding="utf-8") for e in results]
    assert hyps[0] == hyps[1]


def test_translate_nbest_with_ctranslate2_writes_the_torch_list(
    ckpt: Path, ct2_dir: Path, tmp_path: Path
) -> None:
    """``--engine ctranslate2 --nbest 3``: the same tsv lines (index, rank) as torch, the same
    top hypothesis (beam 5, alpha 0) and scores within 1e-3 per token; jsonl likewise."""
    from transformer_mt.cli.translate import main as translate_main

    src = tmp_path / "in.en"
    src.write_text("".join(t + "\n" for t in sources(6)), encoding="utf-8")
    beam = ["--beam-size", "5", "--length-penalty", "0", "--nbest", "3"]
    engines = {"torch": [], "ctranslate2": ["--engine", "ctranslate2", "--ct2-model", str(ct2_dir)]}
    tsv, jsonl = {}, {}
    for name, extra in engines.items():
        for fmt, store in (("tsv", tsv), ("jsonl", jsonl)):
            out = tmp_path / f"{name}.{fmt}"
            args = ["--ckpt", str(ckpt), "-i", str(src), "-o", str(out), *beam, *extra]
            assert translate_main([*args, "--format", fmt] if fmt == "jsonl" else args) == 0
            store[name] = out.read_text(encoding="utf-8").splitlines()
    rows = {name: [line.split("\t") for line in lines] for name, lines in tsv.items()}
    assert [r[:2] for r in rows["ctranslate2"]] == [r[:2] for r in rows["torch"]]
    assert len(rows["torch"]) == 6 * 3
    tops = {name: [r[3] for r in found if r[1] == "1"] for name, found in rows.items()}
    assert tops["ctranslate2"] == tops["torch"]
    records = {name: [json.loads(line) for line in lines] for name, lines in jsonl.items()}
    for mine, theirs in zip(records["torch"], records["ctranslate2"]):
        assert mine["source"] == theirs["source"]
        assert mine["hypotheses"][0]["text"] == theirs["hypotheses"][0]["text"]
        top, other = mine["hypotheses"][0], theirs["hypotheses"][0]
        assert abs(top["score"] - other["score"]) / (len(top["tokens"]) + 1) < 1e-3


def test_ctranslate2_continues_a_prefix_as_ours_and_refuses_what_it_cannot(
    ct2_dir: Path, ckpt: Path
) -> None:
    """A forced start gives the same continuation and score in both engines; CTranslate2
    samples without a seed, and refuses a seed and constraints with one line each."""
    from transformer_mt.errors import SettingError
    from transformer_mt.inference.ctranslate2_engine import CTranslate2Engine

    ours, texts = load_model(ckpt), sources(6)
    engine = CTranslate2Engine(ct2_dir, threads=1)
    prefixes = [" ".join(t.split()[:2]) for t in texts[:3]] + ["", "I", "There are"]
    cap = dict(max_len_a=0.0, max_len_b=CAP)  # outputs end before it (scores differ at a cap)
    for search in (
        SearchConfig(length_penalty=0.0, **cap),
        SearchConfig(beam_size=4, nbest=2, length_penalty=0.0, **cap),
    ):
        mine = Translator(ours, search).translate_batch(texts, prefixes=prefixes)
        theirs = Translator(ours, search, engine=engine).translate_batch(texts, prefixes=prefixes)
        assert [t.text for t in mine] == [t.text for t in theirs]
        assert all(t.text.startswith(p) for t, p in zip(theirs, prefixes))
        ended = [(x, y) for x, y in zip(mine, theirs) if len(x.hypotheses[0].tokens) + 1 < CAP]
        assert len(ended) >= 3
        for x, y in ended:
            assert abs(x.score - y.score) < 1e-3 * (len(x.hypotheses[0].tokens) + 1)
    sampler = Translator(ours, SearchConfig(sampling_topk=5, nbest=3), engine=engine)
    assert [len(t.hypotheses) for t in sampler.translate_batch(texts)] == [3] * 6
    for search, steer in (
        (SearchConfig(sampling_topk=5, seed=1), {}),
        (SearchConfig(beam_size=4), {"constraints": [["Anna"]] * 6}),
    ):
        with pytest.raises(SettingError, match="engine=torch"):
            Translator(ours, search, engine=engine).translate_batch(texts, **steer)
