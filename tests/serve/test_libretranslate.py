"""LibreTranslate's API on the service, driven by its real client (libretranslatepy) over a real
uvicorn: its translations are the service's own, its languages the checkpoint's directions,
HTML keeps its tags, alternatives come from the n-best list, and every refusal is a 4xx in
LibreTranslate's shape, after which the service goes on."""

from __future__ import annotations

import html
import json
import re
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("fastapi", reason="needs the serve extra: pip install -e '.[serve]'")
pytest.importorskip("libretranslatepy", reason="needs the dev extra: pip install -e '.[dev]'")
from fastapi.testclient import TestClient
from libretranslatepy import LibreTranslateAPI
from test_serve_app import SOURCES, write_tiny_checkpoint
from test_serve_guards import live

from transformer_mt.serve.app import create_app
from transformer_mt.serve.libretranslate import directions
from transformer_mt.serve.limits import Limits
from transformer_mt.serve.model import ServedModel

KEY = "s3cret"
SENTENCE = "I have 3 apples."


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The root URL of a real service with an API key, serving the tiny checkpoint."""
    ckpt = write_tiny_checkpoint(tmp_path_factory.mktemp("libretranslate") / "tiny.ckpt")
    app = create_app(ServedModel.open(ckpt), Limits(window_ms=0, max_beam=4), api_key=KEY)
    with live(app) as port:
        yield f"http://127.0.0.1:{port}"


def call(url: str, body: bytes | None = None, **headers: str) -> tuple[int, Any]:
    """Status and JSON answer of one request (``body``: a POST)."""
    request = urllib.request.Request(url, data=body, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def post(root: str, payload: dict[str, Any]) -> tuple[int, Any]:
    body = json.dumps({"api_key": KEY, **payload}).encode()
    return call(f"{root}/libretranslate/translate", body, **{"Content-Type": "application/json"})


def own(root: str, texts: list[str], **options: Any) -> dict[str, Any]:
    """The service's own /translate answer."""
    body = json.dumps({"text": texts, **options}).encode()
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"}
    status, answer = call(f"{root}/translate", body, **headers)
    assert status == 200, answer
    return answer


def test_the_client_translates_and_lists_the_languages(served: str) -> None:
    client = LibreTranslateAPI(f"{served}/libretranslate/", KEY)
    expected = own(served, [SENTENCE])["translations"][0]
    assert client.translate(SENTENCE, "en", "de") == expected
    assert client.languages() == [{"code": "en", "name": "English", "targets": ["de"]}]
    # A list, and source "auto": the model's own source language, said to be detected.
    status, answer = post(served, {"q": [SENTENCE, ""], "source": "auto", "target": "de"})
    assert status == 200 and answer["translatedText"] == [expected, ""]
    assert answer["detectedLanguage"] == [{"confidence": 100.0, "language": "en"}] * 2


def test_html_keeps_its_tags_and_alternatives_come_from_the_nbest(served: str) -> None:
    page = '<p class="x">I have <b>3</b> apples &amp; pears.</p>\n<!-- a note -->'
    status, answer = post(served, {"q": page, "source": "en", "target": "de", "format": "html"})
    assert status == 200, answer
    out = answer["translatedText"]
    assert re.findall(r"<[^>]*>", out) == [
        '<p class="x">',
        "<b>",
        "</b>",
        "</p>",
        "<!-- a note -->",
    ]
    have, three, pears = own(served, ["I have", "3", "apples & pears."])["translations"]
    pears = html.escape(pears, quote=False)
    assert re.split(r"<[^>]*>", out) == ["", f"{have} ", three, f" {pears}", "\n", ""]

    for sentence in SOURCES:  # the first whose three best differ as text (an untrained model)
        nbest = [h["text"] for h in own(served, [sentence], beam_size=3, nbest=3)["nbest"][0]]
        if len(set(nbest)) > 1:
            break
    ask = {"q": sentence, "source": "en", "target": "de", "alternatives": 2}
    status, answer = post(served, ask)
    assert status == 200 and answer["translatedText"] == nbest[0]
    alternatives = list(dict.fromkeys(t for t in nbest[1:] if t != nbest[0]))
    assert answer["alternatives"] == alternatives and alternatives


@pytest.mark.parametrize(
    ("payload", "status", "words"),
    [
        ({"q": SENTENCE, "source": "en", "target": "fr"}, 400, "en-fr is not a language pair"),
        ({"q": SENTENCE, "source": "de", "target": "en"}, 400, "it translates en-de"),
        ({"source": "en", "target": "de"}, 400, "missing q parameter"),
        ({"q": 5, "source": "en", "target": "de"}, 400, "q: Input should be"),
        ({"q": "", "source": "en", "target": "de"}, 400, "q is empty"),
        ({"q": "x", "source": "en", "target": "de", "format": "xml"}, 400, "format:"),
        ({"q": "x", "source": "en", "target": "de", "alternatives": 9}, 400, "alternatives must"),
        ({"q": "\ud800", "source": "en", "target": "de"}, 400, "lone UTF-16 surrogate"),
        ({"q": ["x"] * 300, "source": "en", "target": "de"}, 413, "split the request"),
    ],
)
def test_bad_requests_are_refused_in_libretranslate_s_shape(
    served: str, payload: dict[str, Any], status: int, words: str
) -> None:
    got, answer = post(served, payload)
    assert got == status and list(answer) == ["error"] and words in answer["error"], answer


def test_a_missing_or_wrong_key_and_a_malformed_body_are_refused(served: str) -> None:
    url = f"{served}/libretranslate/"
    for key in (None, "wrong"):
        client = LibreTranslateAPI(url, key)
        for ask, args in ((client.translate, (SENTENCE, "en", "de")), (client.languages, ())):
            with pytest.raises(urllib.error.HTTPError) as caught:
                ask(*args)
            answer = json.loads(caught.value.read())
            assert caught.value.code == 403 and "api_key" in answer["error"], answer
    with pytest.raises(urllib.error.HTTPError) as caught:
        LibreTranslateAPI(url, KEY).translate(SENTENCE, "en", "fr")
    assert caught.value.code == 400 and list(json.loads(caught.value.read())) == ["error"]
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    for body, headers in (
        (b"{not json", {"Content-Type": "application/json"}),
        (b"[1, 2]", {"Content-Type": "application/json"}),
        (b"q=x", {"Content-Type": "text/plain"}),
        (f"q=x&source=en&api_key={KEY}".encode(), form),  # no target
    ):
        got, answer = call(f"{url}translate", body, **headers)
        assert got == 400 and list(answer) == ["error"], (body, answer)
    # The service's bearer header is a key here too (its own clients, the schema fuzzing).
    ask = json.dumps({"q": SENTENCE, "source": "en", "target": "de"}).encode()
    bearer = {"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"}
    assert call(f"{url}translate", ask, **bearer)[0] == 200
    assert call(f"{url}translate", ask, **{**bearer, "Authorization": "Bearer wrong"})[0] == 403
    # The service's own routes still take the key as a bearer header only; it goes on.
    assert call(f"{served}/model")[0] == 401
    status, health = call(f"{served}/health")
    assert status == 200 and health["status"] == "ok"
    assert (
        LibreTranslateAPI(url, KEY).translate(SENTENCE, "en", "de")
        == (own(served, [SENTENCE])["translations"][0])
    )


def test_without_a_service_key_no_key_is_asked(tmp_path: Path) -> None:
    ckpt = write_tiny_checkpoint(tmp_path / "tiny.ckpt")
    with TestClient(create_app(ServedModel.open(ckpt))) as client:
        form = {"q": SENTENCE, "source": "en", "target": "de"}
        answer = client.post("/libretranslate/translate", data=form)
        assert answer.status_code == 200 and isinstance(answer.json()["translatedText"], str)
        assert client.get("/libretranslate/languages").status_code == 200
        # In the service's schema, with every refusal, so that the schema fuzzing covers them.
        paths = client.get("/openapi.json").json()["paths"]
        assert {"400", "403", "413"} <= set(paths["/libretranslate/translate"]["post"]["responses"])
        assert "403" in paths["/libretranslate/languages"]["get"]["responses"]


def test_a_multilingual_model_lists_every_direction() -> None:
    def model(pairs: Any, tags: list[str]) -> Any:
        tokenizer = SimpleNamespace(target_languages=tags)
        data = None if pairs is None else SimpleNamespace(pairs=pairs)
        loaded = SimpleNamespace(
            data_config=lambda: data, tokenizer=tokenizer, src_lang="en", tgt_lang="mul"
        )
        return SimpleNamespace(loaded=loaded)

    pairs = [("de", "en"), ("fr", "en"), ("en", "de"), ("en", "fr")]
    assert directions(model(pairs, ["en", "de", "fr"])) == {
        "de": ["en"], "fr": ["en"], "en": ["de", "fr"],
    }  # fmt: skip
    assert directions(model(None, ["de", "fr"])) == {"en": ["de", "fr"]}
