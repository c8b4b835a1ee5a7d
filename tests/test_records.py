"""The README's results table agrees with the committed records in docs/runs/.

Each row names its record and evaluation in the last cell (`` `name:evaluation` ``); its
BLEU, tokenized BLEU and chrF must be the record's, its training cell the record's epochs,
steps and median tokens/s, its machine cell the record's CPU, family and threads. A row without a
record, a record without its provenance, or one changed digit fails.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from conftest import ROOT

RECORDS = ROOT / "docs" / "runs"
RECORD_CELL = re.compile(r"^`([\w.-]+):([\w.-]+)`$")
NUMBER_COLUMNS = {"BLEU": "bleu", "BLEU tok": "bleu_tok", "chrF": "chrf"}


def results_table(readme: str) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the README table whose last column is ``record``."""
    lines = readme.splitlines()
    for i, line in enumerate(lines):
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and cells[-1] == "record":
            rows = []
            for row in lines[i + 2 :]:
                if not row.startswith("|"):
                    break
                rows.append([c.strip() for c in row.strip().strip("|").split("|")])
            return cells, rows
    raise AssertionError("README.md has no results table with a 'record' column")


def problems(readme: str, records: Path) -> list[str]:
    header, rows = results_table(readme)
    found: list[str] = []
    for row in rows:
        cells = dict(zip(header, row))
        where = f"README row {row[0]!r} ({row[-1]})"
        match = RECORD_CELL.match(row[-1])
        if match is None:
            found.append(f"{where}: the record cell is not `name:evaluation`")
            continue
        name, evaluation = match.groups()
        path = records / f"{name}.json"
        if not path.is_file():
            found.append(f"{where}: no record {path.name}")
            continue
        record = json.loads(path.read_text(encoding="utf-8"))
        for key in ("command", "source", "machine", "training", "evaluations"):
            if not record.get(key):
                found.append(f"{where}: the record lacks {key}")
        if not (record.get("source") or {}).get("commit"):
            found.append(f"{where}: the record names no git commit")
        result = (record.get("evaluations") or {}).get(evaluation)
        if result is None:
            found.append(f"{where}: {path.name} has no evaluation {evaluation!r}")
            continue
        if not result.get("signature", {}).get("bleu"):
            found.append(f"{where}: the evaluation has no sacreBLEU signature")
        for column, metric in NUMBER_COLUMNS.items():
            if column not in cells:
                continue
            shown = cells[column].strip("*")
            want = f"{result['metrics'][metric]:.2f}"
            if shown != want:
                found.append(f"{where}: {column} {shown} but the record says {want}")
        training = record.get("training", {})
        speed = training.get("target_tokens_per_s_median")
        steps = training.get("steps")
        for fact in (
            f"{training.get('epochs')} epochs",
            f"{steps:,} steps" if steps else "",
            f"{speed:,} target tok/s" if speed else "",
        ):
            if fact and fact not in cells.get("training", ""):
                found.append(f"{where}: training cell lacks the record's {fact!r}")
        machine = record.get("machine", {})
        for fact in (
            machine.get("cpu"),
            f"CPU family {machine['cpu_family']}" if machine.get("cpu_family") else None,
            f"{machine.get('threads')} threads",
        ):
            if fact and fact not in cells.get("machine", ""):
                found.append(f"{where}: machine cell lacks the record's {fact!r}")
    return found


def readme() -> str:
    return (ROOT / "README.md").read_text(encoding="utf-8")


def test_the_readme_table_is_its_records() -> None:
    assert problems(readme(), RECORDS) == []


def test_the_check_bites(tmp_path: Path) -> None:
    """One changed BLEU digit, a dropped record file, or a row without a record fail."""
    text = readme()
    header, rows = results_table(text)
    first = " | ".join(rows[0])
    column = header.index("BLEU")
    changed = list(rows[0])
    changed[column] = f"{float(changed[column].strip('*')) + 0.01:.2f}"
    assert problems(text.replace(first, " | ".join(changed), 1), RECORDS)
    assert problems(text.replace(first, " | ".join([*rows[0][:-1], "-"]), 1), RECORDS)
    assert problems(text, tmp_path)  # no records at all


@pytest.mark.parametrize("path", sorted(RECORDS.glob("*.json")), ids=lambda p: p.stem)
def test_every_record_is_complete(path: Path) -> None:
    record = json.loads(path.read_text(encoding="utf-8"))
    assert record["format"] == "transformer_mt.record" and record["name"] == path.stem
    assert record["machine"]["cpu"] and record["machine"]["threads"]
    assert record["training"]["steps"] > 0
    for result in record["evaluations"].values():
        assert set(result["metrics"]) >= {"bleu", "bleu_tok", "chrf"}
        assert result["signature"]["bleu"].startswith("nrefs:1|case:mixed")
