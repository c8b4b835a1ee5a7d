"""Engine worker processes (``--workers``): a call on a worker returns what the same call in
process returns, errors and stops cross the pipe, a dead worker is replaced, and the service
serves through them."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi", reason="needs the serve extra: pip install -e '.[serve]'")
from fastapi.testclient import TestClient
from test_serve_app import LINES, write_tiny_checkpoint

from transformer_mt.cli.serve import main as serve_main
from transformer_mt.inference.search import DecodingCancelled
from transformer_mt.serve.app import create_app
from transformer_mt.serve.limits import Limits
from transformer_mt.serve.model import ServedModel
from transformer_mt.serve.workers import WorkerPool, WorkerSpec


@pytest.fixture(scope="module")
def tiny_ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_checkpoint(tmp_path_factory.mktemp("workers") / "tiny.ckpt")


@pytest.fixture(scope="module")
def served(tiny_ckpt: Path) -> Any:
    """The tiny checkpoint behind two worker processes."""
    model = ServedModel.open(tiny_ckpt, threads=2, workers=2)
    yield model
    model.close()


def texts(translations: list[Any]) -> list[list[str]]:
    return [[h.text for h in t.hypotheses] for t in translations]


@pytest.mark.parametrize("options", [{"beam_size": 1}, {"beam_size": 3, "nbest": 2}])
def test_a_worker_translates_as_the_process_itself_does(
    served: ServedModel, tiny_ckpt: Path, options: dict
) -> None:
    alone = ServedModel.open(tiny_ckpt)
    search = alone.search(**options)
    expected = alone.translate(LINES, search)
    got = served.translate(LINES, search)
    assert texts(got) == texts(expected)
    assert [t.score for t in got] == pytest.approx([t.score for t in expected], abs=1e-5)
    assert served.info()["workers"] == 2 and served.info()["lanes"] == 2


def test_ctranslate2_workers_translate_as_the_process_itself_does(
    tiny_ckpt: Path, tmp_path: Path
) -> None:
    """The workers open the model directory the service's own engine opened."""
    pytest.importorskip("ctranslate2", reason="needs the export extra")
    from transformer_mt.export.convert import export_ctranslate2, export_huggingface

    ct2 = export_ctranslate2(export_huggingface(tiny_ckpt, tmp_path / "hf"), tmp_path / "ct2")
    alone = ServedModel.open(tiny_ckpt, engine="ctranslate2", ct2_model=ct2)
    expected = [t.text for t in alone.translate(LINES, alone.search(beam_size=2))]
    model = ServedModel.open(tiny_ckpt, engine="ctranslate2", ct2_model=ct2, workers=1)
    try:
        assert [t.text for t in model.translate(LINES, model.search(beam_size=2))] == expected
        assert model.info()["engine"] == "ctranslate2" and model.info()["workers"] == 1
    finally:
        model.close()


def test_two_calls_at_once_run_on_the_two_workers(served: ServedModel) -> None:
    """Each lane takes its own worker: calls from two threads together give the serial
    outputs, many rounds over."""
    search = served.search(beam_size=2)
    inputs = [LINES[i:] + LINES[:i] for i in range(2)]
    alone = [texts(served.translate(lines, search)) for lines in inputs]
    barrier = threading.Barrier(2)
    got: list[list[Any]] = [[], []]

    def lane(i: int) -> None:
        for _ in range(5):
            barrier.wait(30)
            got[i].append(texts(served.translate(inputs[i], search)))

    threads = [threading.Thread(target=lane, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert got == [[alone[0]] * 5, [alone[1]] * 5]


def test_a_stop_reaches_the_workers_search(served: ServedModel) -> None:
    """A call whose callers have all gone before it starts stops at the worker's first step;
    the worker then answers the next call."""
    search = served.search(beam_size=1)
    with pytest.raises(DecodingCancelled):
        served.translate(LINES, search, should_stop=lambda: True)
    assert len(served.translate(LINES[:2], search)) == 2


def test_an_engine_error_is_raised_in_the_caller(served: ServedModel) -> None:
    """The worker's exception comes back as the caller's (a SettingError, which does not
    survive pickling, as the ValueError it is), and the worker goes on."""
    search = served.search(beam_size=1)
    with pytest.raises(ValueError, match="fr"):
        served.translate(LINES[:1], search, tgt_lang="fr")
    assert len(served.translate(LINES[:1], search)) == 1


def test_a_dead_worker_is_replaced(tiny_ckpt: Path) -> None:
    model = ServedModel.open(tiny_ckpt, workers=1)
    try:
        assert model.pool is not None
        (pid,) = model.pool.pids
        search = model.search(beam_size=1)
        before = texts(model.translate(LINES[:3], search))
        os.kill(pid, signal.SIGKILL)
        model.pool._all[0].process.join(30)
        assert texts(model.translate(LINES[:3], search)) == before
        assert model.pool.pids != [pid]
    finally:
        model.close()
    assert model.pool.pids == []


def test_a_worker_that_cannot_open_the_model_says_why(tmp_path: Path) -> None:
    spec = WorkerSpec(ServedModel.open, (str(tmp_path / "missing.ckpt"),))
    with pytest.raises(ValueError, match=r"engine worker 0 could not open the model: .*missing"):
        WorkerPool(spec, 1)


def test_the_service_serves_through_workers(tiny_ckpt: Path, served: ServedModel) -> None:
    alone = ServedModel.open(tiny_ckpt)
    expected = [t.text for t in alone.translate(LINES[:4], alone.search())]
    with TestClient(create_app(served, Limits(max_sentences=16, max_chars=2000))) as client:
        answer = client.post("/translate", json={"text": LINES[:4]})
        assert answer.status_code == 200, answer.text
        assert answer.json()["translations"] == expected
        assert client.get("/model").json()["workers"] == 2
        maps = client.post("/attention", json={"text": LINES[0]})
        assert maps.status_code == 200 and maps.json()["translation"] == expected[0]


def test_workers_and_lanes_together_are_one_line(
    tiny_ckpt: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = serve_main(["--ckpt", str(tiny_ckpt), "--port", "0", "--workers", "2", "--lanes", "2"])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert err.startswith("error: --workers 2 and --lanes 2") and "\n" not in err
