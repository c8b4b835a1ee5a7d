"""Steering through the service: seeded sampling, target prefixes, constraints and word
alignments give what ``transformer-mt-translate`` gives with the same flags; every bad
combination is a 422 with one line naming the fix; coalesced requests keep their own steering."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi", reason="needs the serve extra: pip install -e '.[serve]'")
from fastapi.testclient import TestClient
from test_serve_app import LINES, cli_translate, write_tiny_checkpoint

from transformer_mt.inference.search import SearchConfig
from transformer_mt.serve.app import create_app
from transformer_mt.serve.limits import Limits
from transformer_mt.serve.model import ServedModel
from transformer_mt.serve.service import CallOptions, Service

#: One prefix per line of LINES; an empty source gives an empty output whatever its prefix.
PREFIXES = ["Gestern hat", "", "Peter", "Ich weiß", "zwölf", "", "Äpfel", ""]
#: One list of phrases per line of LINES.
CONSTRAINTS = [["Karten"], [], ["neun", "Freitag"], ["zwölf"], [], [], ["Äpfel"], ["x"]]


@pytest.fixture(scope="module")
def tiny_ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_checkpoint(tmp_path_factory.mktemp("steer") / "tiny.ckpt")


@pytest.fixture(scope="module")
def client(tiny_ckpt: Path) -> Any:
    limits = Limits(max_sentences=16, max_chars=2000, max_beam=4)
    with TestClient(create_app(ServedModel.open(tiny_ckpt), limits)) as client:
        yield client


def translate(client: Any, **body: Any) -> dict[str, Any]:
    response = client.post("/translate", json=body)
    assert response.status_code == 200, response.text
    return response.json()


def words(text: str) -> list[str]:
    """Words as alignments count them: runs between spaces, tabs and line breaks."""
    return re.findall(r"[^ \t\r\n\f\v]+", text)


def test_seeded_sampling_repeats_and_equals_the_translate_command(
    client: Any, tiny_ckpt: Path, tmp_path: Path
) -> None:
    options = {"sampling_topk": 0, "temperature": 1.5, "seed": 7}
    first = translate(client, text=LINES, **options)
    assert translate(client, text=LINES, **options) == first
    flags = ["--sampling-topk", "0", "--temperature", "1.5", "--seed", "7"]
    assert first["translations"] == cli_translate(tiny_ckpt, tmp_path, LINES, *flags)
    other = translate(client, text=LINES, **{**options, "seed": 8})
    assert other["translations"] != first["translations"]
    greedy = translate(client, text=LINES)
    assert greedy["translations"] != first["translations"]
    # nbest counts samples, though the stored beam is 1; top-p samples too.
    drawn = translate(client, text=LINES[:2], sampling_topp=0.9, seed=3, nbest=3)
    assert [len(n) for n in drawn["nbest"]] == [3, 3]
    assert drawn == translate(client, text=LINES[:2], sampling_topp=0.9, seed=3, nbest=3)


def test_every_output_starts_with_its_prefix(client: Any, tiny_ckpt: Path, tmp_path: Path) -> None:
    got = translate(client, text=LINES, prefix=PREFIXES, beam_size=2)
    plain = translate(client, text=LINES, beam_size=2)["translations"]
    for prefix, out, alone in zip(PREFIXES, got["translations"], plain):
        assert out.startswith(prefix), (prefix, out)
        if not prefix:
            assert out == alone  # no prefix: the search it would have had
    prefix_file = tmp_path / "prefixes.txt"
    prefix_file.write_text("".join(p + "\n" for p in PREFIXES), encoding="utf-8")
    flags = ["--beam-size", "2", "--prefix-file", str(prefix_file)]
    assert got["translations"] == cli_translate(tiny_ckpt, tmp_path, LINES, *flags)
    # Only empty prefixes: the request is one without.
    empty = translate(client, text=LINES, prefix=[""] * len(LINES), beam_size=2)
    assert empty == translate(client, text=LINES, beam_size=2)


def test_every_output_contains_its_constraints(
    client: Any, tiny_ckpt: Path, tmp_path: Path
) -> None:
    got = translate(client, text=LINES, constraints=CONSTRAINTS, beam_size=3, nbest=2)
    for phrases, source, out in zip(CONSTRAINTS, LINES, got["translations"]):
        if source:
            assert all(p in out for p in phrases), (phrases, out)
    file = tmp_path / "constraints.jsonl"
    file.write_text("".join(json.dumps(c) + "\n" for c in CONSTRAINTS), encoding="utf-8")
    flags = ["--beam-size", "3", "--constraints-file", str(file)]
    assert got["translations"] == cli_translate(tiny_ckpt, tmp_path, LINES, *flags)
    # A prefix and constraints together.
    both = translate(client, text=LINES[:1], prefix=["Gestern"], constraints=[["Karten"]])
    assert both["translations"][0].startswith("Gestern") and "Karten" in both["translations"][0]


def check_pharaoh(alignment: str, source: str, output: str) -> None:
    """Valid Pharaoh pairs: one link per output word, every index within the word counts."""
    pairs = [tuple(map(int, pair.split("-"))) for pair in alignment.split()]
    assert alignment == " ".join(f"{i}-{j}" for i, j in pairs)
    assert all(0 <= i < len(words(source)) for i, _ in pairs), (alignment, source)
    assert [j for _, j in pairs] == list(range(len(pairs))), alignment
    assert len(pairs) <= len(words(output)), (alignment, output)


def test_alignments_are_pharaoh_pairs_within_the_words(
    client: Any, tiny_ckpt: Path, tmp_path: Path
) -> None:
    got = translate(client, text=LINES, beam_size=2, nbest=2, alignments=True)
    assert len(got["alignments"]) == len(LINES)
    for source, out, alignment, nbest in zip(
        LINES, got["translations"], got["alignments"], got["nbest"]
    ):
        check_pharaoh(alignment, source, out)
        assert nbest[0]["alignment"] == alignment
        for hyp in nbest:
            check_pharaoh(hyp["alignment"], source, hyp["text"])
        assert bool(alignment) == bool(words(out) and words(source))
    flags = ["--beam-size", "2", "--nbest", "2", "--format", "jsonl", "--alignments"]
    records = [json.loads(line) for line in cli_translate(tiny_ckpt, tmp_path, LINES, *flags)]
    assert [[h["alignment"] for h in n] for n in got["nbest"]] == [
        [h["alignment"] for h in r["hypotheses"]] for r in records
    ]
    sampled = translate(
        client, text=LINES[:3], prefix=["Gestern", "", "Peter"], sampling_topk=5, seed=1,
        alignments=True,
    )  # fmt: skip
    for source, out, alignment in zip(LINES, sampled["translations"], sampled["alignments"]):
        check_pharaoh(alignment, source, out)
    plain = translate(client, text=LINES[:1], nbest=1)
    assert "alignments" not in plain and "alignment" not in plain["nbest"][0][0]


BAD_STEERING = {
    "fewer prefixes": ({"text": ["a", "b"], "prefix": ["x"]}, "prefix has 1 items but text has 2"),
    "more constraints": (
        {"text": ["a"], "constraints": [["x"], []]},
        "constraints has 2 items but text has 1",
    ),
    "an empty phrase": (
        {"text": ["a", "b"], "constraints": [[], ["Katzen", " "]]},
        "constraints.1.1 is an empty phrase",
    ),
    "a prefix not a list": ({"text": ["a"], "prefix": "x"}, "prefix"),
    "a phrase not text": ({"text": ["a"], "constraints": [["x", 3]]}, "constraints.0.1"),
    "alignments not a bool": ({"text": ["a"], "alignments": "yes"}, "alignments"),
    "sampling with a beam": (
        {"text": ["a"], "sampling_topk": 5, "beam_size": 2},
        'sampling draws one token at a time, but beam_size is 2; set "beam_size": 1',
    ),
    "top-p 0": ({"text": ["a"], "sampling_topp": 0.0}, "sampling_topp must be in (0, 1]"),
    "top-p over 1": ({"text": ["a"], "sampling_topp": 1.5}, "sampling_topp must be in (0, 1]"),
    "top-k negative": ({"text": ["a"], "sampling_topk": -1}, "sampling_topk must be >= 0"),
    "temperature 0": (
        {"text": ["a"], "sampling_topk": 0, "temperature": 0.0},
        "temperature must be > 0",
    ),
    "temperature negative": (
        {"text": ["a"], "sampling_topp": 0.9, "temperature": -1.0},
        "temperature must be > 0",
    ),
    "temperature without sampling": (
        {"text": ["a"], "temperature": 0.7},
        'temperature only applies to sampling; sample with "sampling_topk": 0',
    ),
    "seed without sampling": ({"text": ["a"], "seed": 1}, "seed only applies to sampling"),
    "samples over the limit": (
        {"text": ["a"], "sampling_topk": 0, "nbest": 5},
        "nbest (the samples drawn per sentence) must be 1..4",
    ),
    "constraints with sampling": (
        {"text": ["a"], "sampling_topk": 0, "constraints": [["x"]]},
        "constraints need beam search",
    ),
    "a prefix the model cannot hold": (
        {"text": ["a"], "prefix": ["neun " * 60]},
        "more than the 78 an output of this model can hold; shorten them",
    ),
    "a misspelt field": (
        {"text": ["a"], "prefixes": ["x"]},
        "unknown option 'prefixes'; the options are beam_size, length_penalty, sampling_topk",
    ),
}


@pytest.mark.parametrize("case", list(BAD_STEERING))
def test_bad_steering_is_a_422_line_and_the_service_goes_on(client: Any, case: str) -> None:
    body, words_ = BAD_STEERING[case]
    before = translate(client, text=[LINES[0]])["translations"][0]
    response = client.post("/translate", json=body)
    assert response.status_code == 422, response.text
    assert list(response.json()) == ["error"] and response.text.count("\n") == 0
    message = response.json()["error"]
    assert words_ in message and "; " in message, message
    assert "Traceback" not in message and "Error" not in message
    assert translate(client, text=[LINES[0]])["translations"][0] == before


def test_prefix_and_constraint_characters_count_in_the_limit(client: Any) -> None:
    response = client.post(
        "/translate", json={"text": ["a"], "prefix": ["b" * 1000], "constraints": [["c" * 1000]]}
    )
    assert response.status_code == 413
    assert "2001 characters in one request (prefixes and constraints included)" in response.text


def test_attention_translates_with_the_sampling_fields(client: Any) -> None:
    options = {"sampling_topk": 0, "seed": 5}
    sampled = translate(client, text=[LINES[0]], **options)["translations"][0]
    got = client.post("/attention", json={"text": LINES[0], **options}).json()
    assert got["translation"] == sampled
    bad = client.post("/attention", json={"text": LINES[0], "prefix": ["x"]})
    assert bad.status_code == 422 and "the options are beam_size" in bad.json()["error"]
    assert "translation" in bad.json()["error"] and "alignments" not in bad.json()["error"]


def test_coalesced_requests_keep_their_own_prefixes(tiny_ckpt: Path) -> None:
    """Two requests queued before the batching task runs share one engine call (one batch);
    each gets its own prefixes back, and the outputs of one engine call per request."""
    model = ServedModel.open(tiny_ckpt)
    search = SearchConfig.from_stored(model.loaded.decoding, sampling_topk=0, seed=11)
    requests = [(LINES[:2], ["Gestern", "Wir"]), (LINES[2:4], ["", "Ich"])]
    alone = [
        model.translate(lines, search, prefixes=prefixes, alignments=True)
        for lines, prefixes in requests
    ]

    async def scenario() -> list[Any]:
        service = Service(model, Limits(window_ms=0))
        jobs = [
            service.batcher.submit(
                lines, CallOptions(search, alignments=True), 10, columns={"prefixes": prefixes}
            )
            for lines, prefixes in requests
        ]
        results = await asyncio.gather(*jobs)
        assert service.batcher.batches == 1
        await service.batcher.stop()
        return results

    results = asyncio.run(scenario())
    for (_, prefixes), got, want in zip(requests, results, alone):
        assert [t.text for t in got] == [t.text for t in want]
        assert [t.hypotheses[0].alignment for t in got] == [t.hypotheses[0].alignment for t in want]
        assert all(t.text.startswith(p) for t, p in zip(got, prefixes))


def test_what_ctranslate2_cannot_do_is_refused_and_prefixes_work(
    tiny_ckpt: Path, tmp_path: Path
) -> None:
    pytest.importorskip("ctranslate2", reason="needs the export extra")
    from transformer_mt.export.convert import export_ctranslate2, export_huggingface

    ct2 = export_ctranslate2(export_huggingface(tiny_ckpt, tmp_path / "hf"), tmp_path / "ct2")
    model = ServedModel.open(tiny_ckpt, engine="ctranslate2", ct2_model=ct2)
    with TestClient(create_app(model)) as client:
        for body, words_ in (
            ({"sampling_topk": 0, "seed": 1}, "cannot repeat seeded samples"),
            ({"beam_size": 2, "constraints": CONSTRAINTS}, "cannot decode with constraints"),
        ):
            response = client.post("/translate", json={"text": LINES, **body})
            assert response.status_code == 422, response.text
            message = response.json()["error"]
            assert words_ in message and "; use transformer-mt-serve --engine torch" in message
        attention = client.post("/attention", json={"text": "a", "sampling_topk": 0, "seed": 1})
        assert attention.status_code == 422
        # Unseeded sampling is CTranslate2's own; empty constraint lists ask for nothing.
        assert len(translate(client, text=LINES, sampling_topk=5)["translations"]) == len(LINES)
        none = translate(client, text=LINES, constraints=[[] for _ in LINES])
        assert none == translate(client, text=LINES)
        got = translate(client, text=LINES, prefix=PREFIXES, alignments=True)
    assert all(out.startswith(p) for p, out in zip(PREFIXES, got["translations"]))
    for source, out, alignment in zip(LINES, got["translations"], got["alignments"]):
        check_pharaoh(alignment, source, out)
    prefix_file = tmp_path / "prefixes.txt"
    prefix_file.write_text("".join(p + "\n" for p in PREFIXES), encoding="utf-8")
    flags = ["--engine", "ctranslate2", "--ct2-model", str(ct2), "--prefix-file", str(prefix_file)]
    assert got["translations"] == cli_translate(tiny_ckpt, tmp_path, LINES, *flags)
