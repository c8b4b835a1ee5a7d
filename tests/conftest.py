"""Shared fixtures: tiny dimensions so every test runs in milliseconds on a CPU."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from transformer_mt.cli.hydra_app import register_configs
from transformer_mt.errors import DEBUG_VARIABLES
from transformer_mt.model.transformer import ModelConfig, Transformer

# Every Hydra compose in the tests sees the configs that the commands register.
register_configs()

PAD, BOS, EOS = 0, 1, 2

#: The repository root, this folder (on the subprocesses' PYTHONPATH for ``import conftest``),
#: the checked-in fixtures and the shared Multi30k text beside the repository.
ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"
FIXTURES = TESTS / "fixtures"
MULTI30K = ROOT / "../shared/data/multi30k"


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


def tiny_config(**overrides) -> ModelConfig:
    values = dict(
        src_vocab_size=40,
        tgt_vocab_size=40,
        pad_id=PAD,
        d_model=32,
        n_heads=4,
        d_ff=64,
        n_encoder_layers=2,
        n_decoder_layers=2,
        dropout=0.0,
        max_len=64,
    )
    values.update(overrides)
    return ModelConfig(**values)


@pytest.fixture
def tiny_model() -> Transformer:
    return Transformer(tiny_config()).eval()


def random_batch(batch: int = 3, src_len: int = 7, tgt_len: int = 6, vocab: int = 40):
    """Token ids avoiding the special ids 0..3, with some padding at the ends of rows."""
    src = torch.randint(4, vocab, (batch, src_len))
    tgt = torch.randint(4, vocab, (batch, tgt_len))
    if batch > 1:
        src[1, src_len - 2 :] = PAD
        tgt[1, tgt_len - 2 :] = PAD
    return src, tgt


# ---------------------------------------------------------------- Hydra + training helpers

CONFIGS = ROOT / "configs"

#: Settings that make a full train.run take seconds: tiny model, tiny generated data.
FAST_TRAIN = [
    "model.d_model=32",
    "model.n_heads=2",
    "model.d_ff=64",
    "model.n_encoder_layers=1",
    "model.n_decoder_layers=1",
    "data.sizes.train=300",
    "data.sizes.validation=20",
    "data.sizes.test=20",
    "data.number_range=[2,999]",
    "data.vocab_size=300",
    "data.max_tokens=512",
    "data.cache_dir=null",
    "callbacks=none",
    "logger=csv",
    "trainer.max_epochs=1",
    "trainer.enable_model_summary=false",
    "trainer.enable_progress_bar=false",
    "threads=1",
    # Not auto: a start-up calibration must not decide the precision of a test's run.
    "trainer.precision=32-true",
]


#: FAST_TRAIN on a corpus of files (:func:`write_corpus`); add ``data.dir=...``.
FILES_TRAIN = [
    *(o for o in FAST_TRAIN if not o.startswith("data.")),  # those exist for data=numbers only
    "data=files",
    "data.vocab_size=300",
    "data.max_tokens=512",
    "data.eval_max_tokens=512",
    "data.max_len=64",
    "data.num_workers=0",
    "data.cache_dir=null",
]


def compose_train(run_dir, overrides=(), config_name: str = "train"):
    """Compose configs/<config_name>.yaml as train.py would, writing into ``run_dir``."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        return compose(config_name, overrides=[f"run_dir={run_dir}", *overrides])


def clock_of_batches(monkeypatch: pytest.MonkeyPatch, seconds_per_batch: float) -> list[int]:
    """Replace Lightning's clock in its fit, epoch and evaluation loops with a count of training
    batches, ``seconds_per_batch`` each: a time-based ``val_check_interval`` then fires on
    batches, never on how fast the machine is. Returns the live count (one item)."""
    from types import SimpleNamespace

    from lightning.pytorch.loops import evaluation_loop, fit_loop, training_epoch_loop

    batches = [0]

    def tick() -> float:  # asked once per training batch, whether to validate
        batches[0] += 1
        return seconds_per_batch * batches[0]

    monkeypatch.setattr(training_epoch_loop, "time", SimpleNamespace(monotonic=tick))
    now = SimpleNamespace(monotonic=lambda: seconds_per_batch * batches[0])
    for loop in (fit_loop, evaluation_loop):
        monkeypatch.setattr(loop, "time", now)
    return batches


# ---------------------------------------------------------------- corpus files, runs, commands


def write_corpus(directory: Path, lines: int = 30, **overrides: bytes) -> Path:
    """A tiny parallel corpus {train,val,test}.{en,de}; ``overrides`` replaces whole files.

    A keyword names a file with ``_`` for ``.``: ``train_de=b"..."`` writes ``train.de``.
    """
    directory.mkdir(parents=True, exist_ok=True)
    for prefix in ("train", "val", "test"):
        for lang in ("en", "de"):
            text = "".join(f"{lang} sentence {i} of {prefix}\n" for i in range(lines))
            (directory / f"{prefix}.{lang}").write_bytes(text.encode())
    for name, content in overrides.items():
        (directory / name.replace("_", ".")).write_bytes(content)
    return directory


#: A few words in three languages, for corpora of several directions.
MULTI_WORDS = {
    "en": ["one", "two", "three", "house", "tree", "river"],
    "de": ["eins", "zwei", "drei", "Haus", "Baum", "Fluss"],
    "fr": ["un", "deux", "trois", "maison", "arbre", "rivière"],
}


def write_multi_corpus(directory: Path, lines: int = 30, langs=("en", "de", "fr")) -> Path:
    """Line-aligned {train,val,test}.{lang}: the same sentences in each language."""
    directory.mkdir(parents=True, exist_ok=True)
    for prefix in ("train", "val", "test"):
        for lang in langs:
            words = MULTI_WORDS[lang]
            text = "".join(f"{words[i % 3]} {words[3 + i % 3]} {i}\n" for i in range(lines))
            (directory / f"{prefix}.{lang}").write_text(text, encoding="utf-8")
    return directory


def write_unequal_directions(directory: Path) -> Path:
    """de-en with 40 training pairs and fr-en with 8, in fairseq's per-direction layout
    (train.de-en.de, ...); validation and test shared (val.de, val.fr, val.en)."""
    write_multi_corpus(directory, lines=40, langs=("en", "de", "fr"))
    for lang in ("fr", "en"):
        lines = (directory / f"train.{lang}").read_text(encoding="utf-8").splitlines()[:8]
        (directory / f"train.fr-en.{lang}").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return directory


def load_script(name: str):
    """``scripts/NAME.py`` as a module (the scripts are not a package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def train_multi_run(base: Path) -> Path:
    """A two-epoch en->de+fr run of the tiny model over :func:`write_multi_corpus` (the
    directory of its checkpoints, logs and tokenizer)."""
    from transformer_mt.training.run import run

    corpus = write_multi_corpus(base / "corpus")
    run_dir = base / "run"
    overrides = [*FILES_TRAIN, "trainer.max_epochs=2", "data.max_len=32", f"data.dir={corpus}"]
    run(compose_train(run_dir, [*overrides, "data.directions=[en-de,en-fr]"]))
    return run_dir


def regular_file(tmp: Path) -> Path:
    """A path under which nothing can be created, even by root (unlike chmod 500)."""
    path = tmp / "a_file"
    path.write_text("not a directory")
    return path


def short_run(run_dir: Path, corpus: Path, *extra: str) -> Path:
    """Train 2 steps on ``corpus`` (FILES_TRAIN) in-process into ``run_dir``; its last.ckpt."""
    from transformer_mt.training.run import run

    run(compose_train(run_dir, [*FILES_TRAIN, f"data.dir={corpus}", "trainer.max_steps=2", *extra]))
    return run_dir / "checkpoints" / "last.ckpt"


def package_source(source: Path) -> Path:
    """A copy of what a package build reads (setuptools writes build/ and *.egg-info/ into
    the tree it builds, so tests build from a copy)."""
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, source / name)
    skip = shutil.ignore_patterns("*.egg-info", "__pycache__")
    for name in ("src", "configs"):  # src/transformer_mt/configs stays a link to configs/
        shutil.copytree(ROOT / name, source / name, symlinks=True, ignore=skip)
    return source


def train_py(
    args: list[str], hydra_dir: Path, env: dict[str, str] | None = None, timeout: float = 900
) -> subprocess.CompletedProcess[str]:
    """``python train.py ARGS`` in the project root, as a user runs it; output captured.

    Hydra's run directory is ``hydra_dir`` (``run_dir`` follows it unless ``args`` set it);
    one thread, the Hub offline, and without the debug variables, so that errors look as a
    user sees them unless ``env`` sets one.
    """
    full_env = {k: v for k, v in os.environ.items() if k not in DEBUG_VARIABLES}
    full_env.update(OMP_NUM_THREADS="1", HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1")
    # The test-only callbacks (tests/faults.py) are importable by their module name.
    path = os.pathsep.join(p for p in (str(TESTS), os.environ.get("PYTHONPATH")) if p)
    full_env.update(PYTHONPATH=path)
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "train.py", f"hydra.run.dir={hydra_dir}", *args],
        cwd=ROOT,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def error_line(stderr: str) -> str:
    """The one ``error:`` line of a failure reported to a user; no traceback beside it."""
    assert "Traceback" not in stderr, stderr[-3000:]
    lines = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, stderr[-3000:]
    return lines[0]


# ---------------------------------------------------------------- the shared tiny trained run

#: Training overrides of the shared tiny run; evaluation needs the same data overrides.
DATA_OVERRIDES = [
    "data.sizes.train=1000",
    "data.sizes.validation=40",
    "data.sizes.test=40",
    "data.cache_dir=null",
]
TRAIN_OVERRIDES = [
    *DATA_OVERRIDES,
    "trainer.max_epochs=2",
    "callbacks=none",
    "logger=csv",
    "trainer.enable_model_summary=false",
    "trainer.log_every_n_steps=1",
    "model.d_model=32",
    "model.n_heads=2",
    "model.d_ff=64",
    "model.max_len=65",  # data.max_len (64) + <bos>/<eos> (training/checks.py)
    "module.warmup_steps=10",
    "optimizer.lr=3e-3",
    "threads=1",
]


def train_tiny_run(run_dir: Path) -> Path:
    """Train the tiny model into ``run_dir`` once (idempotent); return ``run_dir``.

    Like ``python train.py``, it leaves ``.hydra/config.yaml`` in the run directory, which
    evaluate.py reads when the checkpoint stores no data config.
    """
    done = run_dir / "DONE"
    if done.exists():
        return run_dir
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from transformer_mt.training.run import run as train_run

    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        cfg = compose("train", overrides=[f"run_dir={run_dir}", *TRAIN_OVERRIDES])
    train_run(cfg)
    (run_dir / ".hydra").mkdir(parents=True, exist_ok=True)
    OmegaConf.save(cfg, run_dir / ".hydra" / "config.yaml")
    done.touch()
    return run_dir


@pytest.fixture(scope="session")
def tiny_run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return train_tiny_run(tmp_path_factory.getbasetemp() / "tiny_run")


def best_checkpoint(run_dir: Path) -> Path:
    """The checkpoint train.run tested: ModelCheckpoint's best_model_path, kept in last.ckpt."""
    from transformer_mt.checkpoint import load_checkpoint

    states = load_checkpoint(run_dir / "checkpoints" / "last.ckpt")["callbacks"]
    (state,) = [s for s in states.values() if s.get("monitor") == "val/bleu"]
    return Path(state["best_model_path"])


def trainer_test_metrics(run_dir: Path) -> dict[str, float]:
    import csv

    with open(run_dir / "csv" / "metrics.csv", newline="") as f:
        rows = [r for r in csv.DictReader(f) if r.get("test/bleu")]
    assert rows, "train.run logged no test metrics"
    return {k: float(v) for k, v in rows[-1].items() if k.startswith("test/") and v}


def evaluate(tmp_path: Path, *overrides: str) -> dict:
    """evaluate.py's pipeline on a composed config, writing into ``tmp_path``."""
    from hydra import compose, initialize_config_dir

    from transformer_mt.cli.evaluate import evaluate as run

    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        cfg = compose("evaluate", overrides=[f"run_dir={tmp_path}", "progress=false", *overrides])
    return run(cfg)


@contextlib.contextmanager
def mounted_tmpfs(mount: Path, size: str):
    """A real, small file system at ``mount`` that can fill up (tmpfs; needs root and mount).

    Skips the test where it cannot be had. Used by the disk-full tests.
    """
    mount.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount)], capture_output=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {done.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def source_tensor(tokenizer, texts: list[str]) -> torch.Tensor:
    """Source rows as training builds them (``ids + <eos>``, padded)."""
    rows = tokenizer.encode_batch(texts, add_special_tokens=True)
    src = torch.full((len(rows), max(map(len, rows))), tokenizer.pad_id, dtype=torch.long)
    for i, row in enumerate(rows):
        src[i, : len(row)] = torch.tensor(row)
    return src


def train_copy_model(steps: int = 150) -> tuple[Any, Transformer]:
    """A tiny post-LN model trained for a few seconds to copy number sentences.

    Copying is learned in a few hundred updates, unlike translation: the model then ends its
    outputs with <eos> near the source length, so search runs as on a real model (beams that
    finish at different steps, no run to the length cap).
    """
    from transformer_mt.data.numbers import number_sentences
    from transformer_mt.data.tokenizer import Tokenizer

    generator = torch.Generator().manual_seed(0)
    en, de = number_sentences(list(range(3, 1500, 3)), "en", "de", seed=0)
    tokenizer = Tokenizer.train([en], [de], vocab_size=400, src_lang="en", tgt_lang="de")
    ids = tokenizer.encode_batch(en)
    v = tokenizer.vocab_size
    config = ModelConfig(v, v, d_model=32, n_heads=4, d_ff=64, n_encoder_layers=1,
                         n_decoder_layers=1, dropout=0.0, max_len=80)  # fmt: skip
    model = Transformer(config)
    optimizer = torch.optim.Adam(model.parameters(), lr=5e-3)
    for _ in range(steps):
        batch = [en[i] for i in torch.randint(0, len(ids), (32,), generator=generator).tolist()]
        src = source_tensor(tokenizer, batch)
        tgt = torch.cat([torch.ones_like(src[:, :1]), src], dim=1)  # <bos> + ids + <eos>
        logits = model(src, tgt[:, :-1])
        loss = torch.nn.functional.cross_entropy(
            logits.reshape(-1, v), tgt[:, 1:].reshape(-1), ignore_index=tokenizer.pad_id
        )
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return tokenizer, model.eval()
