"""One decode loop: the trainer's test/bleu == evaluate.py's BLEU == translate + sacreBLEU.

The three paths share the collate, the source-token batcher, the cut of over-long sources and
the treatment of empty ones (transformer_mt.inference.decode). Two fixtures, one checkpoint
each, scored all three ways:

- ``edge_run`` (seconds): a test split with an empty source and one longer than
  ``data.max_len``, where copies of the loop used to disagree; its BLEU is near 0 (the model
  repeats a token up to the length cap, which depends on the source length after the cut),
  so the hypotheses themselves are compared, line by line;
- ``trained_run`` (slow, ~1-2 minutes on 2 cores): the embedded number sentences learned to a
  BLEU well above 0, so equal BLEU means equal translations of a real test set.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from transformer_mt.cli.translate import main as translate_main
from transformer_mt.data.collate import Collate
from transformer_mt.data.sources import generate_numbers_corpus
from transformer_mt.inference.decode import best_tokens, decode
from transformer_mt.inference.metrics import corpus_scores
from transformer_mt.inference.search import Hypothesis, SearchConfig

from conftest import CONFIGS, best_checkpoint, evaluate, tiny_config, trainer_test_metrics

COMMON = [
    "callbacks=none",
    "logger=csv",
    "trainer.enable_model_summary=false",
    "trainer.enable_progress_bar=false",
    "module.warmup_steps=10",
    "optimizer.lr=3e-3",
    "model.max_len=128",
    "threads=1",
]
EDGE_TRAIN = [
    *COMMON,
    "data=files",
    "data.file_format=parallel",
    "data.vocab_size=300",
    "data.max_tokens=512",
    "data.eval_max_tokens=256",
    "data.max_len=64",
    "data.num_workers=0",
    "data.cache_dir=null",
    "model.d_model=32",
    "model.n_heads=2",
    "model.d_ff=64",
    "model.n_encoder_layers=1",
    "model.n_decoder_layers=1",
    "trainer.max_epochs=2",
]
#: A small model on 4,000 number sentences: test BLEU ~85 (val 10.9 -> 86.7 over the 6 epochs)
#: after 35 s of CPU time (70-120 s wall on the shared 2-core machine).
TRAINED = [
    *COMMON,
    "data.sizes.train=4000",
    "data.sizes.validation=40",
    "data.sizes.test=60",
    "data.cache_dir=null",
    "model.d_model=64",
    "model.n_heads=4",
    "model.d_ff=128",
    "model.n_encoder_layers=2",
    "model.n_decoder_layers=2",
    "model.dropout=0.0",
    "trainer.max_epochs=6",
]


def train(run_dir: Path, overrides: list[str]) -> Path:
    from transformer_mt.training.run import run as train_run

    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        cfg = compose("train", overrides=[f"run_dir={run_dir}", *overrides])
    train_run(cfg)
    (run_dir / ".hydra").mkdir(parents=True, exist_ok=True)
    OmegaConf.save(cfg, run_dir / ".hydra" / "config.yaml")
    return run_dir


def write_edge_corpus(directory: Path) -> tuple[Path, Path]:
    """Number sentences as files; the test split gains an empty and an over-long source."""
    corpus = generate_numbers_corpus(sizes={"train": 1000, "validation": 16, "test": 16}, seed=3)
    directory.mkdir(parents=True)
    for split, prefix in (("train", "train"), ("validation", "val"), ("test", "test")):
        src, tgt = list(corpus[split]["src"]), list(corpus[split]["tgt"])
        if split == "test":
            src[3], tgt[3] = "", "Nichts."
            src[7] = " ".join(src[:5])  # ~200 subword tokens: cut to data.max_len=64
        (directory / f"{prefix}.en").write_text("".join(s + "\n" for s in src))
        (directory / f"{prefix}.de").write_text("".join(t + "\n" for t in tgt))
    return directory / "test.en", directory / "test.de"


@pytest.fixture(scope="session")
def edge_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    base = tmp_path_factory.mktemp("edge")
    sources, references = write_edge_corpus(base / "corpus")
    run_dir = train(base / "run", [*EDGE_TRAIN, f"data.dir={base / 'corpus'}"])
    return run_dir, sources, references


@pytest.fixture(scope="session")
def trained_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    base = tmp_path_factory.mktemp("trained")
    run_dir = train(base / "run", TRAINED)
    test = generate_numbers_corpus(sizes={"train": 4000, "validation": 40, "test": 60}, seed=42)[
        "test"
    ]
    sources, references = base / "test.en", base / "test.de"
    sources.write_text("".join(s + "\n" for s in test["src"]))
    references.write_text("".join(t + "\n" for t in test["tgt"]))
    return run_dir, sources, references


def score_three_ways(run: tuple[Path, Path, Path], tmp_path: Path) -> dict[str, dict]:
    """test/* of the trainer, evaluate.py on the best checkpoint, translate + sacreBLEU."""
    run_dir, sources, references = run
    ckpt = best_checkpoint(run_dir)
    trainer = trainer_test_metrics(run_dir)
    results = evaluate(tmp_path / "evaluate", f"ckpt_path={ckpt}")
    out = tmp_path / "translated.de"
    assert translate_main(["--ckpt", str(ckpt), "-i", str(sources), "-o", str(out), "-q"]) == 0
    translated = out.read_text(encoding="utf-8").split("\n")[:-1]
    refs = references.read_text(encoding="utf-8").split("\n")[:-1]
    scores = corpus_scores(translated, refs, lang="de")
    return {
        "trainer": {"bleu": trainer["test/bleu"], "chrf": trainer["test/chrf"]},
        "evaluate": results["metrics"],
        "translate": {"bleu": scores.bleu, "chrf": scores.chrf},
        "hypotheses": {
            "evaluate": Path(results["hypotheses_path"]).read_text("utf-8").split("\n")[:-1],
            "translate": translated,
        },
    }


def assert_same_scores(scores: dict[str, dict]) -> None:
    for metric in ("bleu", "chrf"):
        # The trainer logs float32: equal to ~1e-5; one changed hypothesis moves BLEU by >0.1.
        expected = scores["evaluate"][metric]
        assert scores["trainer"][metric] == pytest.approx(expected, abs=1e-4), metric
        assert scores["translate"][metric] == pytest.approx(expected, abs=1e-9), metric


def test_empty_and_over_long_sources_decode_alike_in_all_three_paths(edge_run, tmp_path):
    scores = score_three_ways(edge_run, tmp_path)
    hypotheses = scores["hypotheses"]["evaluate"]
    assert scores["hypotheses"]["translate"] == hypotheses
    assert len(hypotheses) == 16 and hypotheses[3] == ""  # an empty source: nothing to say
    assert len(set(hypotheses)) > 3, "all outputs alike: the comparison would prove little"
    assert_same_scores(scores)


@pytest.mark.slow
def test_trained_model_scores_the_same_in_all_three_paths(trained_run, tmp_path):
    scores = score_three_ways(trained_run, tmp_path)
    assert scores["evaluate"]["bleu"] > 50, scores  # well above 0: equality has teeth
    assert scores["hypotheses"]["translate"] == scores["hypotheses"]["evaluate"]
    assert_same_scores(scores)


def test_decode_restores_input_order_and_skips_empty_sources():
    """Batches arrive sorted by length; outputs come back by ``index``; an empty source
    (``<eos>`` alone) gives an empty output and never reaches the model."""
    from transformer_mt.inference.engine import TorchEngine
    from transformer_mt.model.transformer import Transformer

    model = Transformer(tiny_config()).eval()
    engine = TorchEngine(model, bos_id=1, eos_id=2)
    collate = Collate(pad_id=0, bos_id=1, eos_id=2, max_len=None)
    rows = [[5, 6, 7], [], [8, 9], [10]]
    alone = [
        decode(engine, [collate({"src_ids": [r], "index": [0]})], SearchConfig())[0] for r in rows
    ]
    batches = [collate({"src_ids": [rows[i] for i in b], "index": b}) for b in ([3, 1], [2, 0])]
    encoded = []
    encode = model.encode
    model.encode = lambda src, *a, **k: (encoded.append(src.size(0)), encode(src, *a, **k))[1]
    together = decode(engine, batches, SearchConfig())
    assert best_tokens(together) == best_tokens(alone) and together[1] == [Hypothesis([], 0.0)]
    # Scores agree to float rounding (padding changes the summation order of a batch).
    assert [h[0].score for h in together] == pytest.approx([h[0].score for h in alone], abs=1e-5)
    assert encoded == [1, 2]  # the batch [3, 1] reached the model without the empty row 1
