"""The README's results table agrees with the committed records in docs/runs/.

The table has a row per shipped preset, a budget column and a column per machine kind. Each
machine header is ``CPU, CPU family N [model M] (name), T threads``; each cell is ``BEAM /
GREEDY `record` (note)`` (``-`` for a number or a whole cell that is absent). Every number must
be its record's test BLEU (beam 5, greedy), the record's CPU, family, model and threads the
column's, its budget the row's; a beam figure at another length penalty than the preset's, or a
run in bf16-mixed, must say so in the note. A row without a record, a missing record, a record
without its provenance, or one changed digit fails.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from conftest import ROOT

RECORDS = ROOT / "docs" / "runs"
PRESETS = ROOT / "configs" / "experiment"
NUMBER = r"\d+\.\d\d|-"
CELL = re.compile(
    rf"^(?P<beam5>{NUMBER}) / (?P<greedy>{NUMBER}) `(?P<name>[\w.-]+)`(?: \((?P<note>[^)]*)\))?$"
)
MACHINE = re.compile(
    r"^(?P<cpu>.+), CPU family (?P<family>\d+)(?: model (?P<model>\d+))?(?: \([^)]*\))?, "
    r"(?P<threads>\d+) threads$"
)
BUDGET = re.compile(r"^(?:(?P<minutes>\d+) min|(?P<epochs>\d+) epochs)$")
PRESET = re.compile(r"^`([\w.-]+)`")
BEAM_SIZES = {"beam5": 5, "greedy": 1}


def cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def results_table(readme: str) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the README table whose second column is ``budget``."""
    lines = readme.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("|") and cells(line)[1:2] == ["budget"]:
            rows = []
            for row in lines[i + 2 :]:
                if not row.startswith("|"):
                    break
                rows.append(cells(row))
            return cells(line), rows
    raise AssertionError("README.md has no results table with a 'budget' column")


def stored_length_penalty(row: list[str]) -> float | None:
    """The beam length penalty the row's preset stores, if its experiment file states one."""
    match = PRESET.match(row[0])
    path = PRESETS / f"{match.group(1)}.yaml" if match else None
    if path is None or not path.is_file():
        return None
    config = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    return ((config.get("module") or {}).get("decoding") or {}).get("length_penalty")


def record_problems(where: str, record: dict[str, Any]) -> list[str]:
    keys = ("command", "source", "machine", "training", "evaluations")
    found = [f"{where}: the record lacks {key}" for key in keys if not record.get(key)]
    if not (record.get("source") or {}).get("commit"):
        found.append(f"{where}: the record names no git commit")
    return found


def number_problems(where: str, cell: re.Match[str], record: dict[str, Any]) -> list[str]:
    found = []
    if cell["beam5"] == "-" and cell["greedy"] == "-":
        found.append(f"{where}: the cell gives no number")
    for key, beam_size in BEAM_SIZES.items():
        if cell[key] == "-":
            continue
        result = (record.get("evaluations") or {}).get(key)
        if result is None:
            found.append(f"{where}: the record has no evaluation {key!r}")
            continue
        if not result.get("signature", {}).get("bleu"):
            found.append(f"{where}: {key} has no sacreBLEU signature")
        if result.get("data") != "test" or result.get("decoding", {}).get("beam_size") != beam_size:
            found.append(f"{where}: {key} is not a test score at beam size {beam_size}")
        want = f"{result['metrics']['bleu']:.2f}"
        if cell[key] != want:
            found.append(f"{where}: {key} BLEU {cell[key]} but the record says {want}")
    return found


def note_problems(
    where: str, cell: re.Match[str], record: dict[str, Any], stored: float | None
) -> list[str]:
    """A beam figure at another α than the preset stores, or a bf16 run, says so."""
    found = []
    note = cell["note"] or ""
    beam = (record.get("evaluations") or {}).get("beam5") or {}
    alpha = beam.get("decoding", {}).get("length_penalty")
    said = re.search(r"α (\d+(?:\.\d+)?)", note)
    if cell["beam5"] != "-" and said and float(said.group(1)) != alpha:
        found.append(f"{where}: the note says α {said.group(1)}, the record {alpha}")
    if cell["beam5"] != "-" and not said and stored is not None and alpha != stored:
        found.append(f"{where}: beam 5 ran at α {alpha}, the preset stores {stored}; say so")
    bf16 = str(record.get("settings", {}).get("precision_chosen", "")).startswith("bf16")
    if bf16 != ("bf16-mixed" in note):
        found.append(f"{where}: the note and the record disagree on bf16-mixed")
    return found


def machine_problems(where: str, column: re.Match[str] | None, record: dict[str, Any]) -> list[str]:
    if column is None:
        return [f"{where}: the column is not 'CPU, CPU family N [model M] (name), T threads'"]
    machine = record.get("machine", {})
    model = machine.get("cpu_model_number")
    # Records older than the model number name the family alone; their column may name both.
    model = column["model"] if model is None else str(model)
    shown = (column["cpu"], int(column["family"]), column["model"], int(column["threads"]))
    want = (machine.get("cpu"), machine.get("cpu_family"), model, machine.get("threads"))
    return [] if shown == want else [f"{where}: the column says {shown}, the record {want}"]


def budget_problems(where: str, budget: str, record: dict[str, Any]) -> list[str]:
    match = BUDGET.match(budget)
    settings, training = record.get("settings", {}), record.get("training", {})
    if match is None:
        return [f"{where}: the budget {budget!r} is not 'N min' or 'N epochs'"]
    if match["minutes"]:
        minutes = int(match["minutes"])
        want = f"00:{minutes // 60:02d}:{minutes % 60:02d}:00"
        ok = settings.get("max_time") == want
    else:
        ok = settings.get("max_time") is None and training.get("epochs") == int(match["epochs"])
    return [] if ok else [f"{where}: the record's budget is not {budget!r}"]


def problems(readme: str, records: Path) -> list[str]:
    header, rows = results_table(readme)
    columns = {i: MACHINE.match(title) for i, title in enumerate(header) if i >= 2}
    found: list[str] = []
    for row in rows:
        where = f"README row {row[0]!r}"
        if len(row) != len(header):
            found.append(f"{where}: {len(row)} cells, the header has {len(header)}")
            continue
        cited = [(i, c) for i, c in enumerate(row) if i >= 2 and c != "-"]
        if not cited:
            found.append(f"{where}: no cell names a record")
        for i, text in cited:
            here = f"{where}, {header[i]!r}"
            cell = CELL.match(text.replace("*", ""))
            if cell is None:
                found.append(f"{here}: the cell is not 'BEAM / GREEDY `record` (note)'")
                continue
            path = records / f"{cell['name']}.json"
            if not path.is_file():
                found.append(f"{here}: no record {path.name}")
                continue
            record = json.loads(path.read_text(encoding="utf-8"))
            found += record_problems(here, record)
            found += number_problems(here, cell, record)
            found += note_problems(here, cell, record, stored_length_penalty(row))
            found += machine_problems(here, columns[i], record)
            found += budget_problems(here, row[1], record)
    return found


def readme() -> str:
    return (ROOT / "README.md").read_text(encoding="utf-8")


def test_the_readme_table_is_its_records() -> None:
    assert problems(readme(), RECORDS) == []


def test_the_check_bites(tmp_path: Path) -> None:
    """One changed digit, a record that is not there, a row without a record, a record in
    another machine's column, or no records at all fail."""
    text = readme()
    header, rows = results_table(text)
    first = " | ".join(rows[0])
    i, cell = next((i, c) for i, c in enumerate(rows[0]) if CELL.match(c))
    beam = CELL.match(cell)["beam5"]

    def with_cell(new: str, index: int = i) -> str:
        return text.replace(first, " | ".join([*rows[0][:index], new, *rows[0][index + 1 :]]), 1)

    assert problems(with_cell(cell.replace(beam, f"{float(beam) + 0.01:.2f}", 1)), RECORDS)
    name = CELL.match(cell)["name"]
    assert problems(with_cell(cell.replace(f"`{name}`", "`no_such_record`")), RECORDS)
    empty = " | ".join([*rows[0][:2], *["-"] * (len(header) - 2)])
    assert problems(text.replace(first, empty, 1), RECORDS)
    other = next(j for j in range(2, len(header)) if j != i)
    moved = [*rows[0]]
    moved[i], moved[other] = moved[other], moved[i]
    assert problems(text.replace(first, " | ".join(moved), 1), RECORDS)
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
