"""The paper's Table 3 sweep (``hparams_search=paper_table3``) and its table
(scripts/paper_table3.py): every row is queued for every seed and is one change from the
preset; the table's statistics match hand-computed values; docs/table3.md is its records."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import optuna
import pytest
from omegaconf import OmegaConf

from conftest import ROOT, compose_train, load_script

table3 = load_script("paper_table3")
ROWS = sorted(p.stem for p in (ROOT / "configs" / "table3").glob("*.yaml"))
SEEDS = (1, 2, 3)


def test_the_script_knows_every_row_and_the_paper_only_known_rows() -> None:
    assert sorted(table3.ROWS) == ROWS
    assert set(table3.PAPER) <= set(ROWS) - {"base"}


def test_one_command_queues_every_row_for_every_seed_and_records_a_finished_trial(
    tmp_path: Path,
) -> None:
    """The documented command with one trial, shrunk to the embedded numbers data: the study
    holds all 57 (row, seed) points, seed 1 of every row first, the first one run; the rest
    wait (none is failed for lying beyond the trials asked for) and the run becomes a record
    the table reads."""
    sweep = tmp_path / "sweep"
    command = [
        sys.executable, "train.py", "-m", "hparams_search=paper_table3", "data=numbers",
        "data.sizes.train=200", "data.sizes.validation=10", "data.sizes.test=10",
        "model=tiny", "trainer.max_steps=4", f"hydra.sweep.dir={sweep}",
        "hydra.sweeper.n_trials=1",
    ]  # fmt: skip
    env = dict(os.environ, OMP_NUM_THREADS="1", WANDB_MODE="offline")
    proc = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    study = optuna.load_study(study_name="paper_table3", storage=f"sqlite:///{sweep / 'optuna.db'}")
    trials = study.get_trials(deepcopy=False)
    points = [t.params or t.system_attrs["fixed_params"] for t in trials]
    assert points[0]["+table3"] == "base"
    assert {int(p["seed"]) for p in points[: len(ROWS)]} == {1}
    assert sorted((p["+table3"], int(p["seed"])) for p in points) == sorted(
        (row, seed) for row in ROWS for seed in SEEDS
    )
    states = [t.state for t in trials]
    assert states[0] == optuna.trial.TrialState.COMPLETE
    assert states[1:] == [optuna.trial.TrialState.WAITING] * (len(ROWS) * len(SEEDS) - 1)

    records = tmp_path / "records"
    [path] = table3.record_sweep(sweep, records)
    assert path.name == "base_seed1.json"
    record = json.loads(path.read_text(encoding="utf-8"))
    assert "+table3=base" in record["settings"]["overrides"]
    assert record["training"]["steps"] == 4
    assert set(record["training"]["last_validation"]) == {"bleu", "ppl"}
    assert table3.record_sweep(sweep, records) == []  # a record is made once
    [row] = table3.table(table3.read_runs(records))["rows"]
    assert row["row"] == "base" and row["seeds"] == 1 and row["parameters"] > 0


def _model(tmp_path: Path, *overrides: str) -> dict[str, Any]:
    cfg = compose_train(tmp_path, ["experiment=multi30k_de_en", *overrides])
    return OmegaConf.to_container(cfg.model, resolve=True) | {
        "label_smoothing": cfg.module.label_smoothing
    }


@pytest.mark.parametrize("row", [r for r in ROWS if r != "base"])
def test_each_row_is_one_change_from_the_preset_and_builds(row: str, tmp_path: Path) -> None:
    from transformer_mt.training.checks import check_settings

    base, changed = _model(tmp_path), _model(tmp_path, f"+table3={row}")
    assert _model(tmp_path, "+table3=base") == base
    differing = {k for k in base if base[k] != changed[k]}
    group = row.split("_")[0]
    allowed = {
        "A": {"n_heads"},
        "B": {"d_k", "d_v"},
        "C": {"n_encoder_layers", "n_decoder_layers", "d_model", "d_ff"},
        "D": {"dropout", "label_smoothing"},
        "E": {"positional"},
    }[group]
    assert differing and differing <= allowed, differing
    check_settings(compose_train(tmp_path, ["experiment=multi30k_de_en", f"+table3={row}"]))


def _record(
    directory: Path, row: str, seed: int, bleu: float, ppl: float, test: float | None = None
) -> None:
    record = {
        "evaluations": {"test": {"metrics": {"bleu": test}}} if test is not None else {},
        "machine": {"cpu": "Test CPU", "cpu_family": 1, "cpu_model_number": 2},
        "settings": {"parameters": 1_000_000},
        "training": {"steps": 1000, "last_validation": {"bleu": bleu, "ppl": ppl}},
    }
    directory.mkdir(exist_ok=True)
    (directory / f"{row}_seed{seed}.json").write_text(json.dumps(record), encoding="utf-8")


def test_the_table_from_synthetic_runs_matches_hand_computed_values(tmp_path: Path) -> None:
    runs = {
        "base": [30.0, 31.0, 32.0],  # mean 31, sd 1
        "A_h1": [28.0, 29.0, 30.0],  # -2 ± sqrt(1/3 + 1/3): resolved, paper -0.9: agrees
        "A_h2": [29.0, 29.5, 30.0],  # -1.5 ± 0.645: resolved, paper -0.3: agrees
        "A_h8": [31.0, 31.5, 32.0],  # +0.5; paper 0.0: not judged
        "A_h16": [29.7, 29.9, 30.1],  # -1.1 ± 0.589: under 2 se, not judged
        "D_drop0": [33.0, 34.0, 35.0],  # +3 ± 0.816: resolved, paper -1.2: disagrees
        "C_n2": [25.0],  # one seed: no standard error, not judged
    }
    for row, values in runs.items():
        for seed, bleu in enumerate(values, 1):
            _record(tmp_path, row, seed, bleu, ppl=5.0 + seed, test=bleu + 1 if seed < 3 else None)
    result = table3.table(table3.read_runs(tmp_path))
    rows = {r["row"]: r for r in result["rows"]}
    assert [r["row"] for r in result["rows"]] == [
        "base", "A_h1", "A_h2", "A_h8", "A_h16", "C_n2", "D_drop0",
    ]  # fmt: skip
    assert rows["base"]["bleu"] == pytest.approx(31.0) and rows["base"]["bleu_sd"] == 1.0
    assert rows["A_h1"]["bleu_delta"] == pytest.approx(-2.0)
    assert rows["A_h1"]["bleu_se"] == pytest.approx(math.sqrt(2 / 3))
    assert rows["A_h2"]["bleu_se"] == pytest.approx(math.sqrt(1 / 3 + 0.25 / 3))
    assert rows["A_h1"]["paper_bleu_delta"] == pytest.approx(-0.9)
    assert rows["D_drop0"]["paper_ppl_delta"] == pytest.approx(0.85)
    assert [rows[r]["agrees"] for r in ("A_h1", "A_h2", "A_h8", "D_drop0", "C_n2")] == [
        True, True, None, False, None,
    ]  # fmt: skip
    assert rows["C_n2"]["bleu_se"] is None and rows["C_n2"]["bleu_sd"] is None
    assert rows["A_h1"]["ppl_delta"] == pytest.approx(0.0)  # the same ppl per seed
    assert (result["resolved"], result["agree"]) == (3, 2)
    assert rows["A_h16"]["agrees"] is None
    # (A) ranks: ours h1 1, h2 2, h16 3, h8 4; the paper's h1 1, h16 2, h2 3, h8 4.
    assert result["spearman"]["A"] == pytest.approx(1 - 6 * 2 / (4 * 15))
    assert result["spearman"]["C"] is None  # a single (C) row
    assert "| A_h1 | (A) h 1, d_k = d_v = 128 (h x d_k = d_model kept) |" in table3.markdown(result)
    assert rows["base"]["test_bleu"] == pytest.approx(31.5) and rows["base"]["test_seeds"] == 2
    assert "Test2016 BLEU, greedy, scored once at the end: base 31.50 ± 0.71 (2 seeds)" in (
        table3.markdown(result)
    )


def test_ranks_share_ties_and_spearman_reads_order_only() -> None:
    assert table3.ranks([3.0, 1.0, 2.0, 2.0]) == [4.0, 1.0, 2.5, 2.5]
    assert table3.spearman([1.0, 2.0, 3.0], [30.0, 20.0, 10.0]) == pytest.approx(-1.0)
    assert table3.spearman([1.0, 2.0, 3.0, 4.0], [1.0, 3.0, 2.0, 4.0]) == pytest.approx(0.8)


def test_the_doc_and_its_json_are_the_committed_records() -> None:
    result = table3.table(table3.read_runs())
    text = table3.DOC.read_text(encoding="utf-8")
    block = text.split(table3.BEGIN, 1)[1].split(table3.END, 1)[0]
    assert block == f"\n{table3.markdown(result)}"
    stored = json.loads(table3.DOC.with_suffix(".json").read_text(encoding="utf-8"))
    assert stored == json.loads(json.dumps(result))
    assert table3.DOC.with_suffix(".png").is_file()
