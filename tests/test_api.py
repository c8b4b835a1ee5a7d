"""The public Python API (``transformer_mt``): train and evaluate give what their commands give
on the embedded data, the translator gives what ``transformer-mt-translate`` gives on both
engines, importing the package stays cheap, and the README's example runs as written."""

from __future__ import annotations

import csv
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import transformer_mt
from transformer_mt import SearchConfig, Translator, evaluate, train
from transformer_mt.cli.translate import main as translate_main
from transformer_mt.errors import DEBUG_VARIABLES

from conftest import FAST_TRAIN, ROOT, train_py

LINES = ["I know that Anna has four apples.", "", "Tom sees 12 dogs."]


def metrics(run_dir: Path) -> list[dict[str, str]]:
    """The logged rows of a run, without the one column that measures the machine."""
    with open(run_dir / "csv" / "metrics.csv", newline="") as f:
        return [
            {k: v for k, v in row.items() if k != "train/tokens_per_sec"}
            for row in csv.DictReader(f)
        ]


@pytest.fixture(scope="module")
def api_run(tmp_path_factory: pytest.TempPathFactory) -> transformer_mt.TrainResult:
    return train(overrides=[*FAST_TRAIN, f"run_dir={tmp_path_factory.mktemp('api') / 'run'}"])


@pytest.fixture(scope="module")
def ckpt(api_run: transformer_mt.TrainResult) -> Path:
    return api_run.run_dir / "checkpoints" / "last.ckpt"


def test_importing_the_package_loads_nothing_heavy_and_exports_the_api() -> None:
    probe = "import sys, transformer_mt; print([m for m in ('torch', 'hydra') if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
    assert all(getattr(transformer_mt, name) for name in transformer_mt.__all__)
    assert transformer_mt.SearchConfig is SearchConfig
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        _ = transformer_mt.nothing  # type: ignore[attr-defined]


def test_train_and_evaluate_give_what_their_commands_give(
    api_run: transformer_mt.TrainResult, ckpt: Path, tmp_path: Path
) -> None:
    done = train_py(FAST_TRAIN, tmp_path / "command")
    assert done.returncode == 0, done.stderr[-3000:]
    rows = metrics(api_run.run_dir)
    assert rows == metrics(tmp_path / "command")
    assert api_run.metric == float([r for r in rows if r["val/bleu"]][-1]["val/bleu"])
    tested = [r for r in rows if r.get("test/bleu")][-1]
    assert api_run.metrics["test/bleu"] == float(tested["test/bleu"])
    assert "val/loss" in api_run.metrics and "test/chrf" in api_run.metrics

    results = evaluate(overrides=[f"ckpt_path={ckpt}", f"run_dir={tmp_path / 'eval'}"])
    env = {k: v for k, v in os.environ.items() if k not in DEBUG_VARIABLES}
    command = [sys.executable, "evaluate.py", f"ckpt_path={ckpt}"]
    command += [f"hydra.run.dir={tmp_path / 'eval_command'}", "progress=false"]
    done = subprocess.run(command, cwd=ROOT, env={**env, "OMP_NUM_THREADS": "1"}, text=True,
                          capture_output=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    written = json.loads((tmp_path / "eval_command" / "results.json").read_text())
    assert results["metrics"] == written["metrics"] and results["n_sentences"] == 20


def test_a_bad_override_is_refused_as_its_command_spells_it(ckpt: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"got 0; set decoding\.beam_size=1"):
        evaluate(overrides=[f"ckpt_path={ckpt}", "decoding.beam_size=0", f"run_dir={tmp_path}"])


@pytest.mark.parametrize("engine", ["torch", "ctranslate2"])
def test_the_translator_gives_what_the_translate_command_gives(
    ckpt: Path, tmp_path: Path, engine: str
) -> None:
    if engine == "ctranslate2":
        pytest.importorskip("ctranslate2", reason="needs the export extra")
    source, out = tmp_path / "in.txt", tmp_path / "out.txt"
    source.write_text("".join(f"{line}\n" for line in LINES), encoding="utf-8")
    flags = ["--ckpt", str(ckpt), "--engine", engine, "-i", str(source), "-o", str(out)]
    assert translate_main([*flags, "--beam-size", "3", "--nbest", "2"]) == 0
    nbest = [line.split("\t") for line in out.read_text(encoding="utf-8").splitlines()]

    translator = Translator.from_checkpoint(ckpt, engine=engine, device="cpu")
    found = translator.translate_batch(LINES, beam_size=3, nbest=2)
    assert [[h.text for h in t.hypotheses] for t in found] == [
        [row[3] for row in nbest if row[0] == str(i)] for i in range(len(LINES))
    ]
    assert translator.translate(LINES, search=SearchConfig(beam_size=3)) == [t.text for t in found]
    assert translator.translate(["Ein Hund."]) and len(translator.translate(LINES)) == 3


def test_the_translator_scores_and_refuses_in_its_own_spelling(ckpt: Path) -> None:
    translator = Translator.from_checkpoint(ckpt, device="cpu")
    (scored,) = translator.score([LINES[0]], ["Ich weiß."])
    assert scored.tokens[-1] == "<eos>" and scored.total < 0
    with pytest.raises(ValueError, match=r"beam_size must be >= 1, got 0; set beam_size=1"):
        translator.translate(LINES, beam_size=0)
    with pytest.raises(TypeError, match="unknown search setting beam; the settings are"):
        translator.translate(LINES, beam=4)
    with pytest.raises(TypeError, match=r"pass a list: \['Ein Hund.'\]"):
        translator.translate("Ein Hund.")
    with pytest.raises(ValueError, match="translates into de only, not fr; use tgt_lang=de"):
        translator.translate(LINES, tgt_lang="fr")


def readme_example() -> str:
    """The Python block of README.md's "From Python" section."""
    section = (ROOT / "README.md").read_text(encoding="utf-8").split("## From Python", 1)[1]
    found = re.search(r"```python\n(.*?)```", section.split("\n## ", 1)[0], re.S)
    assert found, 'README.md "From Python" has no ```python block'
    return found.group(1)


def test_the_readme_example_runs_as_written(tmp_path: Path) -> None:
    """In a fresh process, as a user runs it; its run directory and evaluation land in
    ``tmp_path``."""
    code = readme_example()
    assert len([line for line in code.splitlines() if line.strip()]) <= 5, "five lines at most"
    env = {k: v for k, v in os.environ.items() if k not in DEBUG_VARIABLES}
    env.update(PYTHONPATH=str(ROOT / "src"), HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1")
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
        timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "run" / "checkpoints" / "last.ckpt").is_file()
    assert "'bleu':" in done.stdout and done.stdout.rstrip().splitlines()[-1].startswith("[")
