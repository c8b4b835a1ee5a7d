"""transformer-mt-serve's HTTP API in process: answers equal transformer-mt-translate's, every
bad request is a 4xx with one line of JSON and the service goes on, attention has the shapes and
values of the model's own pass."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

pytest.importorskip("fastapi", reason="needs the serve extra: pip install -e '.[serve]'")
from fastapi.testclient import TestClient

from transformer_mt.checkpoint import CHECKPOINT_KEY, load_model, save_checkpoint
from transformer_mt.cli.serve import KEY_VARIABLE
from transformer_mt.cli.serve import main as serve_main
from transformer_mt.cli.translate import main as translate_main
from transformer_mt.data.numbers import number_sentences
from transformer_mt.data.tokenizer import Tokenizer
from transformer_mt.inference.attention_maps import record_maps
from transformer_mt.inference.search import SearchConfig
from transformer_mt.inference.translator import Candidate, Translation
from transformer_mt.model.transformer import ModelConfig, Transformer
from transformer_mt.serve.app import create_app
from transformer_mt.serve.limits import Limits
from transformer_mt.serve.model import ServedModel

from conftest import tiny_config

SOURCES, TARGETS = number_sentences(list(range(3, 900, 3)), "en", "de", seed=0)
LINES = [*SOURCES[:5], "", "I ❤️ 🍎 apples, 日本語", "x" * 300]


def write_tiny_checkpoint(path: Path, seed: int = 0) -> Path:
    """A seeded, untrained tiny model with a real BPE tokenizer (numbers en->de).

    Untrained, it runs to the length cap, so the stored decoding keeps outputs short. Every
    seed gets the same tokenizer (an ensemble may mix them).
    """
    tokenizer = Tokenizer.train([SOURCES], [TARGETS], vocab_size=300, src_lang="en", tgt_lang="de")
    v = tokenizer.vocab_size
    config: ModelConfig = tiny_config(src_vocab_size=v, tgt_vocab_size=v, max_len=80)
    torch.manual_seed(seed)
    model = Transformer(config).eval()
    checkpoint = {
        "state_dict": {f"model.{k}": t for k, t in model.state_dict().items()},
        "global_step": 0,
        # What train.py's checkpoint callback records (Lightning keys it by class and settings).
        "callbacks": {
            "SafeModelCheckpoint{'monitor': 'val/bleu', 'mode': 'max'}": {
                "monitor": "val/bleu",
                "current_score": torch.tensor(12.5),
            }
        },
        CHECKPOINT_KEY: {
            "format": 1,
            "model_config": config.to_dict(),
            "tokenizer": tokenizer.to_json(),
            "src_lang": "en",
            "tgt_lang": "de",
            "decoding": {"beam_size": 1, "length_penalty": 0.6, "max_len_a": 0.5, "max_len_b": 4},
            "data": None,
        },
    }
    return save_checkpoint(checkpoint, path)


@pytest.fixture(scope="module")
def tiny_ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_checkpoint(tmp_path_factory.mktemp("serve") / "tiny.ckpt")


@pytest.fixture(scope="module")
def client(tiny_ckpt: Path) -> Any:
    limits = Limits(max_sentences=16, max_chars=2000, max_beam=4)
    with TestClient(create_app(ServedModel.open(tiny_ckpt), limits)) as client:
        yield client


def cli_translate(ckpt: Path, tmp_path: Path, lines: list[str], *args: str) -> list[str]:
    src, out = tmp_path / "in.txt", tmp_path / "out.txt"
    src.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    assert translate_main(["--ckpt", str(ckpt), "-i", str(src), "-o", str(out), *args]) == 0
    return out.read_text(encoding="utf-8").split("\n")[:-1]


@pytest.mark.parametrize(
    ("options", "flags"),
    [
        ({}, []),
        ({"beam_size": 3, "length_penalty": 1.0}, ["--beam-size", "3", "--length-penalty", "1.0"]),
    ],
)
def test_translate_equals_the_translate_command(
    client: Any, tiny_ckpt: Path, tmp_path: Path, options: dict, flags: list[str]
) -> None:
    expected = cli_translate(tiny_ckpt, tmp_path, LINES, *flags)
    assert any(expected) and expected[5] == ""
    whole = client.post("/translate", json={"text": LINES, **options})
    assert whole.status_code == 200, whole.text
    assert whole.json()["translations"] == expected
    assert whole.json()["model"] == {
        "checkpoint": "tiny.ckpt", "src_lang": "en", "tgt_lang": "de", "engine": "torch"
    }  # fmt: skip
    for line, want in zip(LINES[:3], expected):  # one sentence per request, as the page sends
        alone = client.post("/translate", json={"text": [line], **options}).json()
        assert alone["translations"] == [want]


def test_ctranslate2_engine_equals_the_translate_command(tiny_ckpt: Path, tmp_path: Path) -> None:
    pytest.importorskip("ctranslate2", reason="needs the export extra")
    from transformer_mt.export.convert import export_ctranslate2, export_huggingface

    ct2 = export_ctranslate2(export_huggingface(tiny_ckpt, tmp_path / "hf"), tmp_path / "ct2")
    flags = ["--engine", "ctranslate2", "--ct2-model", str(ct2), "--compute-type", "int8"]
    for options, extra in (({}, []), ({"beam_size": 2}, ["--beam-size", "2"])):
        expected = cli_translate(tiny_ckpt, tmp_path, LINES, *flags, *extra)
        model = ServedModel.open(
            tiny_ckpt, engine="ctranslate2", ct2_model=ct2, compute_type="int8"
        )
        with TestClient(create_app(model)) as client:
            got = client.post("/translate", json={"text": LINES, **options}).json()
            assert got["translations"] == expected
            assert got["model"]["engine"] == "ctranslate2"
            assert client.get("/model").json()["compute_type"] == "int8"


BAD_REQUESTS = {
    "not JSON": (b"{text: nope", 400, "not valid JSON"),
    "not an object": (b'["a"]', 422, "body"),
    "text missing": (b"{}", 422, "text is missing"),
    "text not a list": (b'{"text": "one sentence"}', 422, "text"),
    "a number in text": (b'{"text": ["a", 3]}', 422, "text.1"),
    "empty list": (b'{"text": []}', 422, "empty list"),
    "too many sentences": (json.dumps({"text": ["a"] * 17}).encode(), 413, "at most 16"),
    "too many characters": (json.dumps({"text": ["a" * 1500] * 2}).encode(), 413, "at most 2000"),
    "body too large": (json.dumps({"text": ["a" * 100_000]}).encode(), 413, "bytes"),
    "beam size 0": (b'{"text": ["a"], "beam_size": 0}', 422, "beam_size must be 1..4"),
    "beam size 5": (b'{"text": ["a"], "beam_size": 5}', 422, "beam_size must be 1..4"),
    "nbest over the beam": (
        b'{"text": ["a"], "beam_size": 2, "nbest": 3}',
        422,
        "nbest must be 1..beam_size (2)",
    ),
    "nbest over the default beam": (
        b'{"text": ["a"], "nbest": 2}',
        422,
        "nbest must be 1..beam_size (1)",
    ),
    "beam size a string": (b'{"text": ["a"], "beam_size": "2"}', 422, "beam_size"),
    "negative penalty": (b'{"text": ["a"], "length_penalty": -1}', 422, "length_penalty"),
    "unknown option": (b'{"text": ["a"], "beam": 2}', 422, "unknown option 'beam'"),
    "a path": (b'{"text": ["a"], "ckpt": "/etc/passwd"}', 422, "unknown option 'ckpt'"),
    # Valid JSON that is no text: a lone surrogate, in every field the service tokenizes.
    "a lone surrogate": (b'{"text": ["a \\ud800"]}', 422, "text.0: holds a lone UTF-16"),
    "a lone surrogate in a prefix": (
        b'{"text": ["a"], "prefix": ["\\udfff"]}',
        422,
        "prefix.0: holds a lone UTF-16",
    ),
    "a lone surrogate in a constraint": (
        b'{"text": ["a"], "beam_size": 2, "constraints": [["x\\ud800"]]}',
        422,
        "constraints.0.0: holds a lone UTF-16",
    ),
    "a lone surrogate as tgt_lang": (
        b'{"text": ["a"], "tgt_lang": "\\ud800"}',
        422,
        "tgt_lang: holds a lone UTF-16",
    ),
}


@pytest.mark.parametrize("case", list(BAD_REQUESTS))
def test_bad_requests_are_one_json_line_and_the_service_goes_on(client: Any, case: str) -> None:
    body, status, words = BAD_REQUESTS[case]
    response = client.post("/translate", content=body, headers={"Content-Type": "application/json"})
    assert response.status_code == status, response.text
    assert list(response.json()) == ["error"] and "\n" not in response.json()["error"]
    assert words in response.json()["error"]
    assert response.text.count("\n") == 0
    again = client.post("/translate", json={"text": [LINES[0]]})
    assert again.status_code == 200 and len(again.json()["translations"]) == 1


@pytest.mark.parametrize("field", ["text", "translation"])
def test_attention_refuses_a_lone_surrogate(client: Any, field: str) -> None:
    body = {"text": "one", "translation": "eins"} | {field: "zwei \ud800"}
    headers = {"Content-Type": "application/json"}
    response = client.post("/attention", content=json.dumps(body), headers=headers)
    assert response.status_code == 422, response.text
    assert response.json()["error"].startswith(f"{field}: holds a lone UTF-16 surrogate")


def test_unknown_route_and_method_are_json_errors(client: Any) -> None:
    for response, status in ((client.get("/nothing"), 404), (client.get("/translate"), 405)):
        assert response.status_code == status and list(response.json()) == ["error"]
    assert client.get("/translate").headers["allow"] == "POST"  # RFC 9110: what it takes


def test_model_health_docs_and_page(client: Any, tiny_ckpt: Path) -> None:
    info = client.get("/model").json()
    loaded = load_model(tiny_ckpt)
    assert info["src_lang"] == "en" and info["tgt_lang"] == "de"
    assert info["parameters"] == sum(p.numel() for p in loaded.model.parameters())
    assert info["decoding"]["beam_size"] == 1 and info["decoding"]["length_penalty"] == 0.6
    assert info["val_bleu"] == 12.5
    assert info["config"]["n_heads"] == 4 and info["limits"]["max_beam"] == 4
    assert client.get("/health").json()["status"] == "ok"
    paths = client.get("/openapi.json").json()["paths"]
    assert {"/translate", "/attention", "/model", "/health"} <= set(paths)
    assert client.get("/docs").status_code == 200
    page = client.get("/")
    assert page.status_code == 200 and 'id="source"' in page.text
    # The page loads nothing from another host: it must work offline.
    for name in ("/", "/static/app.js", "/static/style.css"):
        text = client.get(name).text
        assert "http://" not in text and "https://" not in text and "//cdn" not in text, name


def test_attention_is_the_models_own_teacher_forced_pass(client: Any, tiny_ckpt: Path) -> None:
    source = LINES[0]
    translation = client.post("/translate", json={"text": [source]}).json()["translations"][0]
    got = client.post("/attention", json={"text": source}).json()
    assert got["translation"] == translation  # default: attend over the model's own output
    loaded = load_model(tiny_ckpt)
    tok = loaded.tokenizer
    maps = record_maps(
        loaded, tok.encode_src_batch([source])[0], tok.encode_tgt_batch([translation])[0]
    )
    S, T = len(maps.src_labels), len(maps.out_labels)
    assert got["source_tokens"] == maps.src_labels and got["output_tokens"] == maps.out_labels
    assert got["source_tokens"][-1] == "<eos>" and got["input_tokens"][0] == "<bos>"
    for kind, shape in (("encoder_self", (S, S)), ("decoder_self", (T, T)), ("cross", (T, S))):
        assert len(got[kind]) == loaded.config.n_decoder_layers
        for layer, weights in enumerate(got[kind]):
            expected = getattr(maps, kind)[layer]
            assert expected.shape == (4, *shape)
            torch.testing.assert_close(torch.tensor(weights), expected, atol=5e-4, rtol=0)
    # Any output may be attended over (forced decoding of the user's own translation).
    own = client.post("/attention", json={"text": source, "translation": "Hallo Welt"}).json()
    assert own["translation"] == "Hallo Welt"
    assert len(own["cross"][0][0]) == len(own["output_tokens"])
    assert got["truncated"] == own["truncated"] == {"source": 0, "translation": 0}


def test_attention_says_what_the_models_limit_cut(client: Any, tiny_ckpt: Path) -> None:
    """The maps cover what the model reads (its positional limit); the answer says how many
    tokens of each side were cut to fit."""
    source, output = " ".join(["seven"] * 120), " ".join(["sieben"] * 120)
    got = client.post("/attention", json={"text": source, "translation": output})
    assert got.status_code == 200, got.text
    tok, limit = load_model(tiny_ckpt).tokenizer, 80 - 1  # max_len 80: room for <eos>
    sent = len(tok.encode_src_batch([source])[0]), len(tok.encode_tgt_batch([output])[0])
    assert got.json()["truncated"] == {"source": sent[0] - limit, "translation": sent[1] - limit}
    assert len(got.json()["source_tokens"]) == limit + 1


class BlockingModel:
    """A stand-in for ServedModel whose engine calls wait for the test's signal."""

    engine_kind = "fake"
    needs_tgt_lang = False
    defaults = SearchConfig()

    def __init__(self) -> None:
        self.calls: list[list[str]] = []
        self.release = threading.Event()
        self.entered = threading.Event()
        self.loaded = SimpleNamespace(decoding=None)  # the stored decoding: none

    def translate(self, lines: list[str], search: Any, **steer: Any) -> list[Translation]:
        self.calls.append(list(lines))
        self.entered.set()
        assert self.release.wait(30), "the test never released the engine"
        return [Translation(line, [Candidate(line.upper(), 0.0, [])]) for line in lines]

    def source_tokens(self, lines: list[str]) -> int:
        return len(lines)

    def info(self) -> dict[str, Any]:
        return {"checkpoint": "-", "src_lang": "en", "tgt_lang": "de", "engine": "fake"}


def test_a_timed_out_request_does_not_block_the_queue() -> None:
    """Events decide every outcome, not the clock: the first request (a 60 s time-out) holds
    the engine until the test releases it; the second gets a 0.01 s time-out while the engine
    is held, so it certainly times out, however slow the machine, and its job is dropped. Once
    released, the first is answered, the dropped job never runs, and the queue goes on."""
    model = BlockingModel()
    app = create_app(model, Limits(window_ms=0))  # type: ignore[arg-type]
    service = app.state.service
    with TestClient(app) as client:
        first: dict[str, Any] = {}
        worker = threading.Thread(
            target=lambda: first.update(r=client.post("/translate", json={"text": ["one"]}))
        )
        worker.start()
        assert model.entered.wait(30)
        service.limits = Limits(timeout_s=0.01, window_ms=0)
        late = client.post("/translate", json={"text": ["two"]})
        assert late.status_code == 504 and "no answer within 0.01 s" in late.json()["error"]
        service.limits = Limits(window_ms=0)
        model.release.set()
        worker.join(30)
        assert first["r"].json()["translations"] == ["ONE"]
        after = client.post("/translate", json={"text": ["three"]})
        assert after.json()["translations"] == ["THREE"]
    assert model.calls == [["one"], ["three"]]


class FailingModel(BlockingModel):
    """An engine that fails with internals a client must not see."""

    def translate(self, lines: list[str], search: Any, **steer: Any) -> list[Translation]:
        raise RuntimeError("CUDA error at /srv/secret/model.py:42")


def test_a_failure_tells_the_client_an_incident_id_and_the_log_the_details(
    caplog: pytest.LogCaptureFixture,
) -> None:
    app = create_app(FailingModel())  # type: ignore[arg-type]
    with TestClient(app) as client:
        response = client.post("/translate", json={"text": ["one"]})
        assert response.status_code == 500
        message = response.json()["error"]
        assert "secret" not in message and "RuntimeError" not in message
        incident = message.split("(incident ")[1].split(")")[0]
        assert "; retry" in message and len(incident) == 8
        assert any(
            incident in r.getMessage() and "secret" in str(r.exc_info) for r in caplog.records
        )
        app.state.service.model.source_tokens = None  # a bug outside the engine: the same
        careless = TestClient(app, raise_server_exceptions=False)
        bug = careless.post("/translate", json={"text": ["a"]})
        assert bug.status_code == 500 and "incident" in bug.json()["error"]
        assert "TypeError" not in bug.json()["error"]


def test_a_disconnected_client_does_not_block_the_queue() -> None:
    """Drive the ASGI app directly: the second client disconnects while the first request
    holds the engine; its job is dropped, and the next request is answered."""
    model = BlockingModel()
    app = create_app(model, Limits(window_ms=0))  # type: ignore[arg-type]

    async def request(text: str, gone: asyncio.Event | None = None) -> list[dict]:
        body = json.dumps({"text": [text]}).encode()
        messages = [{"type": "http.request", "body": body, "more_body": False}]
        sent: list[dict] = []

        async def receive() -> dict:
            if messages:
                return messages.pop(0)
            if gone is not None:
                await gone.wait()
            else:
                await asyncio.Event().wait()  # connected until the task ends
            return {"type": "http.disconnect"}

        async def send(message: dict) -> None:
            sent.append(message)

        scope = {
            "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
            "scheme": "http", "path": "/translate", "raw_path": b"/translate", "query_string": b"",
            "root_path": "", "headers": [(b"content-type", b"application/json"),
                                         (b"content-length", str(len(body)).encode())],
            "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80),
        }  # fmt: skip
        await app(scope, receive, send)
        return sent

    def answer(sent: list[dict]) -> Any:
        return json.loads(b"".join(m.get("body", b"") for m in sent if "body" in m))

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        first = asyncio.ensure_future(request("one"))
        await loop.run_in_executor(None, model.entered.wait, 30)
        gone = asyncio.Event()
        second = asyncio.ensure_future(request("two", gone))
        while app.state.service.batcher.pending == 0 and not second.done():  # "two" is queued
            await asyncio.sleep(0)
        gone.set()
        assert answer(await second)["error"] == "the client closed the connection"
        model.release.set()
        assert answer(await first)["translations"] == ["ONE"]
        assert answer(await request("three"))["translations"] == ["THREE"]
        await app.state.service.batcher.stop()

    asyncio.run(scenario())
    assert model.calls == [["one"], ["three"]]


def test_command_line_mistakes_are_one_error_line(
    tiny_ckpt: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each is refused before anything is served: one ``error:`` line, exit status 2."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = str(taken.getsockname()[1])
        cases = {
            "no such file": (
                ["--ckpt", str(tmp_path / "missing.ckpt"), "--port", "0"], "does not exist"),
            "port in use": (
                ["--ckpt", str(tiny_ckpt), "--port", port], f"cannot listen on 127.0.0.1:{port}"),
            "ct2 flag": (
                ["--ckpt", str(tiny_ckpt), "--ct2-model", str(tmp_path)],
                "--ct2-model applies to --engine ctranslate2"),
            "torch compute type": (
                ["--ckpt", str(tiny_ckpt), "--compute-type", "int4"],
                "the torch engine has no compute type 'int4'; use --compute-type int8"),
            "compile, a deleted flag": (
                ["--ckpt", str(tiny_ckpt), "--compile"], "unrecognized arguments: --compile"),
            "workers, a deleted flag": (
                ["--ckpt", str(tiny_ckpt), "--workers", "2"],
                "unrecognized arguments: --workers 2"),
            "lanes, a deleted flag": (
                ["--ckpt", str(tiny_ckpt), "--lanes", "2"], "unrecognized arguments: --lanes 2"),
            "bad limit": (["--ckpt", str(tiny_ckpt), "--max-beam", "0"], "--max-beam: got '0'"),
            "no checkpoint": (["--port", "0"], "required: --ckpt"),
            "a key a header cannot carry": (
                ["--ckpt", str(tiny_ckpt), "--api-key", "two words"], "printable ASCII"),
        }  # fmt: skip
        for case, (argv, words) in cases.items():
            assert serve_main(argv) == 2, case
            err = capsys.readouterr().err.strip().splitlines()
            assert len(err) == 1 and err[0].startswith("error: ") and words in err[0], (case, err)


def test_nbest_and_scores_equal_the_translate_command(
    client: Any, tiny_ckpt: Path, tmp_path: Path
) -> None:
    flags = ["--beam-size", "3", "--nbest", "2", "--format", "jsonl"]
    records = [json.loads(line) for line in cli_translate(tiny_ckpt, tmp_path, LINES, *flags)]
    got = client.post("/translate", json={"text": LINES, "beam_size": 3, "nbest": 2}).json()
    assert got["translations"] == [r["hypotheses"][0]["text"] for r in records]
    assert [[h["text"] for h in n] for n in got["nbest"]] == [
        [h["text"] for h in r["hypotheses"]] for r in records
    ]
    for mine, theirs in zip(got["nbest"], records):
        assert [h["score"] for h in mine] == pytest.approx(
            [h["score"] for h in theirs["hypotheses"]], abs=1e-5
        )
    assert got["scores"] == [n[0]["score"] for n in got["nbest"]]
    assert "nbest" not in client.post("/translate", json={"text": LINES[:1]}).json()


def test_an_ensemble_equals_the_translate_command(tiny_ckpt: Path, tmp_path: Path) -> None:
    other = write_tiny_checkpoint(tmp_path / "other.ckpt", seed=1)
    flags = ["--ckpt", str(other), "--beam-size", "2"]
    expected = cli_translate(tiny_ckpt, tmp_path, LINES, *flags)
    alone = cli_translate(tiny_ckpt, tmp_path, LINES, "--beam-size", "2")
    assert expected != alone  # the second model changes the outputs
    with TestClient(create_app(ServedModel.open([tiny_ckpt, other]))) as client:
        got = client.post("/translate", json={"text": LINES, "beam_size": 2}).json()
        assert got["translations"] == expected
        assert client.get("/model").json()["ensemble"] == ["tiny.ckpt", "other.ckpt"]


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--timeout-s", "nan"), ("--timeout-s", "inf"), ("--timeout-s", "0"),
        ("--timeout-s", "-1"), ("--window-ms", "1e12"), ("--window-ms", "-0.5"),
        ("--window-ms", "nan"), ("--max-pending", "0"), ("--max-pending", "1.5"),
        ("--max-sentences", "nan"), ("--max-chars", "10000000"), ("--max-beam", "inf"),
        ("--batch-tokens", "-3"), ("--max-attention-values", "0"), ("--threads", "-1"),
        ("--threads", "x"), ("--port", "65536"), ("--port", "-1"),
    ],
)  # fmt: skip
def test_numbers_that_are_not_numbers_are_refused(
    flag: str, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """NaN, infinities and values out of range: one ``error:`` line, exit 2, nothing loaded
    (the checkpoint does not even exist)."""
    assert serve_main(["--ckpt", "missing.ckpt", flag, value]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: argument {flag}: got {value!r}"), err


def test_limits_refuse_what_the_command_line_refuses() -> None:
    """The service's own check, for a caller that builds :class:`Limits` in code."""
    for bad in ({"timeout_s": float("nan")}, {"window_ms": 1e12}, {"max_pending": 0}):
        with pytest.raises(ValueError, match="give a finite number in that range"):
            Limits(**bad)


def test_serving_beyond_this_machine_needs_a_key_or_insecure(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Checked once the socket is bound and before the model loads: the missing checkpoint is
    the next error, so each case is told apart by the lines before it."""
    monkeypatch.delenv(KEY_VARIABLE, raising=False)
    missing = ["--ckpt", "missing.ckpt", "--port", "0"]

    def lines(*argv: str) -> list[str]:
        assert serve_main([*missing, *argv]) == 2
        return capsys.readouterr().err.strip().splitlines()

    listened: list[Any] = []
    listen = socket.socket.listen
    monkeypatch.setattr(socket.socket, "listen", lambda s, *a: listened.append(s) or listen(s, *a))
    (refused,) = lines("--host", "0.0.0.0")
    assert refused.startswith("error: --host 0.0.0.0 serves every machine") and "--insecure" in (
        refused
    )
    assert listened == []  # refused once bound: the public port never took a connection
    warning, error = lines("--host", "0.0.0.0", "--insecure")
    assert warning.startswith("warning: serving 0.0.0.0:") and "without an API key" in warning
    assert "does not exist" in error
    for argv in (["--host", "0.0.0.0", "--api-key", "k"], ["--host", "localhost"], []):
        (only,) = lines(*argv)
        assert "does not exist" in only, argv
    monkeypatch.setenv(KEY_VARIABLE, "from-the-environment")
    (only,) = lines("--host", "0.0.0.0")
    assert "does not exist" in only


def test_small_engine_calls_run_on_one_thread_and_large_ones_on_all(
    tiny_ckpt: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A call of fewer than ONE_THREAD_ROWS rows (sentences x beams) runs on one intra-op
    thread, a larger one on --threads; CTranslate2 loads with one thread unless told."""
    from transformer_mt.serve import model as served

    set_to: list[int] = []
    monkeypatch.setattr(torch, "get_num_threads", lambda: 0)
    monkeypatch.setattr(torch, "set_num_threads", set_to.append)
    model = ServedModel.open(tiny_ckpt, threads=3)
    search = SearchConfig.from_stored(model.loaded.decoding, beam_size=1)
    beam4 = SearchConfig.from_stored(model.loaded.decoding, beam_size=4)
    model.translate(LINES[:2], search)
    model.translate(LINES[:2] * 4, beam4)  # 8 sentences x 4 beams
    model.translate(LINES[:2] * 16, search)
    assert set_to == [1, 3, 3] and served.ONE_THREAD_ROWS == 32
    opened: list[int] = []
    monkeypatch.setattr(
        served, "open_engine", lambda *a, threads, **k: opened.append(threads) or None
    )
    for threads in (0, 2):
        ServedModel.open(tiny_ckpt, engine="ctranslate2", threads=threads)
    assert opened == [1, 2]
