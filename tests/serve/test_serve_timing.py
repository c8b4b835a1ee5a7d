"""The ``Server-Timing`` header: every stage of a /translate request, in order, adding up."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from test_serve_app import SOURCES, write_tiny_checkpoint

from transformer_mt.serve.app import create_app
from transformer_mt.serve.limits import Limits
from transformer_mt.serve.model import ServedModel
from transformer_mt.serve.timing import STAGES, Stopwatch, header


def parse(value: str) -> dict[str, float]:
    """A ``Server-Timing`` value whose entries are all ``name;dur=ms``, as {name: ms}."""
    pairs = (entry.strip().split(";dur=") for entry in value.split(","))
    return {name: float(ms) for name, ms in pairs}


def test_a_translation_tells_each_stage_in_order_and_they_add_up_to_the_total(
    tmp_path: Path,
) -> None:
    model = ServedModel.open(write_tiny_checkpoint(tmp_path / "tiny.ckpt"))
    with TestClient(create_app(model, Limits(window_ms=0))) as client:
        answer = client.post("/translate", json={"text": SOURCES[:2]})
        health = client.get("/health")
    assert answer.status_code == 200
    stages = parse(answer.headers["server-timing"])
    assert list(stages) == [*STAGES, "answer", "total"]
    assert all(ms >= 0 for ms in stages.values())
    assert stages["engine"] > 0
    parts = sum(ms for name, ms in stages.items() if name != "total")
    assert parts == pytest.approx(stages["total"], abs=0.01)  # rounded to microseconds each
    # A route that queues nothing tells its total alone.
    assert list(parse(health.headers["server-timing"])) == ["total"]


def test_the_header_round_trips_and_unmarked_stages_are_left_out() -> None:
    watch = Stopwatch()
    watch.start = 10.0
    watch.mark("read", 10.001)
    watch.mark("engine", 10.004)  # queue, check, handoff never marked: folded into engine
    durations = watch.durations(10.005)
    assert [name for name, _ in durations] == ["read", "engine", "answer", "total"]
    told = parse(header(durations).decode())
    assert told == pytest.approx({"read": 1.0, "engine": 3.0, "answer": 1.0, "total": 5.0})
