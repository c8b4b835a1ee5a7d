"""The attention page in a real browser: headless Chromium (Debian's, driven by Playwright)
against a real ``transformer-mt-serve`` process on 127.0.0.1.

Type a sentence, press Translate: the translation the API gives appears, the cross-attention
heatmap of layer 0, head 0 has one row per output piece and one column per source piece, and
hovering an output piece highlights exactly the source pieces it attends to most. With a
prefix typed, the output starts with it, and hovering a word of the output (or of the source)
marks the words the API's alignment links it to. Skips with the reason when no browser is
installed (``.ci/run`` installs Debian's ``chromium``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_serve_app import LINES, write_tiny_checkpoint

from transformer_mt.cli.serve import KEY_VARIABLE

from conftest import train_multi_run

pytest.importorskip("fastapi", reason="needs the serve extra: pip install -e '.[serve]'")
playwright = pytest.importorskip("playwright.sync_api", reason="needs playwright (dev extra)")

CHROMIUM = next(
    (p for p in (os.environ.get("CHROMIUM"), "/usr/bin/chromium", shutil.which("chromium")) if p),
    None,
)
if CHROMIUM is None or not Path(CHROMIUM).exists():
    pytest.skip(
        "no Chromium found (install Debian's chromium, or set CHROMIUM=/path/to/chrome)",
        allow_module_level=True,
    )

#: Flags that let Chromium run headless as root in a container with no network (Playwright
#: gives each launch a fresh profile directory of its own).
FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip


def serve_command() -> list[str]:
    script = Path(sys.executable).with_name("transformer-mt-serve")
    if script.exists():
        return [str(script)]
    return [sys.executable, "-m", "transformer_mt.cli.serve"]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A transformer-mt-serve process on a free port; yields its base URL."""
    yield from serve(tmp_path_factory, {})


@pytest.fixture(scope="module")
def keyed_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The same, with an API key."""
    yield from serve(tmp_path_factory, {KEY_VARIABLE: KEY})


@pytest.fixture(scope="module")
def multi_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The same, over a tiny model trained for en->de and en->fr."""
    run_dir = train_multi_run(tmp_path_factory.mktemp("multi"))
    yield from serve(tmp_path_factory, {}, run_dir / "checkpoints" / "last.ckpt")


KEY = "browser-key"


def serve(
    tmp_path_factory: pytest.TempPathFactory, extra_env: dict[str, str], ckpt: Path | None = None
) -> Iterator[str]:
    ckpt = ckpt or write_tiny_checkpoint(tmp_path_factory.mktemp("browser") / "tiny.ckpt")
    env = {k: v for k, v in os.environ.items() if k != KEY_VARIABLE}
    env.update(OMP_NUM_THREADS="1", **extra_env)
    proc = subprocess.Popen(
        [*serve_command(), "--ckpt", str(ckpt), "--port", "0", "--threads", "1"],
        stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    try:
        url = None
        assert proc.stderr is not None
        for line in proc.stderr:  # the socket listens before the line is printed
            if line.startswith("serving on "):
                url = line.split()[-1]
                break
        assert url, f"transformer-mt-serve exited with {proc.wait()} before serving"
        # Keep reading its log, so that a full pipe can never stall the server.
        threading.Thread(target=proc.stderr.read, daemon=True).start()
        yield url
    finally:
        proc.terminate()
        proc.wait(30)


def post(url: str, body: dict[str, Any], headers: dict[str, str] | None = None) -> Any:
    request = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json", **(headers or {})}
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.load(response)


@pytest.fixture(scope="module")
def page(server: str) -> Iterator[Any]:
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        page = browser.new_page(viewport={"width": 1200, "height": 900})
        page.set_default_timeout(60_000)
        yield page
        browser.close()


def test_translate_draw_and_hover(server: str, page: Any, tmp_path: Path) -> None:
    sentence = LINES[0]
    expected = post(f"{server}/translate", {"text": [sentence]})["translations"][0]
    maps = post(f"{server}/attention", {"text": sentence, "translation": expected})

    page.goto(server)
    page.fill("#source", sentence)
    page.click("#translate")
    table = page.locator('table.heatmap[data-kind="cross"][data-layer="0"][data-head="0"]')
    table.wait_for()
    assert page.input_value("#output") == expected
    assert page.locator("#error").is_hidden()

    # One row per output piece (with <eos>), one column per source piece (with <eos>).
    rows, cols = len(maps["output_tokens"]), len(maps["source_tokens"])
    assert table.locator("tbody tr").count() == rows
    assert table.locator("thead th[data-col]").count() == cols
    assert table.locator("tbody tr").first.locator("td").count() == cols
    assert table.locator("tbody th").all_inner_texts() == maps["output_tokens"]

    # Hovering output piece i marks the source pieces with at least half its largest weight.
    for i in (0, rows - 1):
        page.hover(f'.out-token[data-index="{i}"]')
        weights = maps["cross"][0][0][i]
        want = [j for j, w in enumerate(weights) if w >= 0.5 * max(weights)]
        marked = page.locator(".src-token.attended")
        got = [int(v) for v in marked.evaluate_all("els => els.map(e => e.dataset.index)")]
        assert got == want and want

    # All heads of a layer side by side.
    page.select_option("#head", "all")
    assert page.locator('table.heatmap[data-kind="cross"]').count() == maps["n_heads"]
    page.screenshot(path=str(tmp_path / "page.png"), full_page=True)


def marked(page: Any, selector: str) -> list[int]:
    return [
        int(v) for v in page.locator(selector).evaluate_all("els => els.map(e => e.dataset.index)")
    ]


def test_a_prefix_and_word_alignments(server: str, page: Any) -> None:
    sentence, prefix = LINES[2], "Peter kaufte"
    body = {"text": [sentence], "prefix": [prefix], "alignments": True}
    expected = post(f"{server}/translate", body)
    output = expected["translations"][0]
    pairs = [tuple(map(int, p.split("-"))) for p in expected["alignments"][0].split()]
    assert output.startswith(prefix) and pairs

    page.goto(server)
    page.fill("#source", sentence)
    page.fill("#prefix", prefix)
    page.click("#translate")
    page.locator('table.heatmap[data-kind="cross"]').first.wait_for()
    assert page.input_value("#output") == output
    assert page.locator("#alignment").is_visible()
    assert page.inner_text("#pharaoh") == expected["alignments"][0]
    # The words the alignment counts: runs between spaces, tabs and line breaks.
    for side, text in (("src", sentence), ("out", output)):
        want = re.findall(r"[^ \t\r\n\f\v]+", text)
        assert page.locator(f".{side}-word").all_inner_texts() == want

    # An output word marks the source word it is aligned to, and a source word its outputs.
    for j in (0, len(pairs) - 1):
        page.hover(f'.out-word[data-index="{j}"]')
        assert marked(page, ".src-word.aligned") == [i for i, jj in pairs if jj == j]
        assert marked(page, ".out-word.active") == [j]
    source_word = pairs[0][0]
    page.hover(f'.src-word[data-index="{source_word}"]')
    assert marked(page, ".out-word.aligned") == [j for i, j in pairs if i == source_word]
    assert marked(page, ".src-word.active") == [source_word]
    assert not marked(page, ".src-word.aligned")

    # An output of the user's own has no alignment: the strips go, the heatmaps stay.
    page.fill("#output", "Hallo Welt")
    page.click("#attend")
    page.locator("#alignment").wait_for(state="hidden")
    assert page.locator('table.heatmap[data-kind="cross"]').count() >= 1


def test_a_multilingual_model_gets_a_target_language_selector(
    server: str, multi_server: str, page: Any
) -> None:
    """The page of a model with one target language has no selector; that of an en->de+fr
    model offers both, and each choice gives the API's translation into that language (and
    its attention maps)."""
    page.goto(server)
    page.wait_for_function("!document.getElementById('model-info').textContent.startsWith('load')")
    assert page.locator("#tgt-lang-field").is_hidden()

    sentence = "one house 3"
    page.goto(multi_server)
    page.locator("#tgt-lang-field").wait_for(state="visible")
    options = page.locator("#tgt-lang option").evaluate_all("els => els.map(e => e.value)")
    assert options == ["de", "fr"]
    for lang in ("fr", "de"):
        expected = post(f"{multi_server}/translate", {"text": [sentence], "tgt_lang": lang})
        page.select_option("#tgt-lang", lang)
        page.fill("#source", sentence)
        page.fill("#output", "")
        page.click("#translate")
        page.wait_for_function("document.getElementById('output').value !== ''")
        page.locator('table.heatmap[data-kind="cross"]').first.wait_for()
        assert page.input_value("#output") == expected["translations"][0]
        assert page.locator("#error").is_hidden()


def test_errors_show_on_the_page(page: Any, server: str) -> None:
    page.goto(server)
    page.fill("#source", "a sentence")
    page.fill("#beam", "99")
    page.click("#translate")
    error = page.locator("#error")
    error.wait_for(state="visible")
    assert "beam_size must be 1..16" in error.inner_text()


def test_the_page_sends_the_key_of_its_address_or_asks_for_it(keyed_server: str, page: Any) -> None:
    """``/#key=KEY`` stores the key for the tab (and leaves the address); a tab without it is
    asked once, at the first 401, and then works."""
    sentence = LINES[0]
    auth = {"Authorization": f"Bearer {KEY}"}
    expected = post(f"{keyed_server}/translate", {"text": [sentence]}, auth)["translations"][0]
    page.goto(f"{keyed_server}/#key={KEY}")
    assert "#" not in page.url
    page.fill("#source", sentence)
    page.click("#translate")
    page.locator('table.heatmap[data-kind="cross"]').first.wait_for()
    assert page.input_value("#output") == expected and page.locator("#error").is_hidden()

    fresh = page.context.browser.new_page()
    asked: list[str] = []
    fresh.on("dialog", lambda dialog: (asked.append(dialog.message), dialog.accept(KEY)))
    fresh.goto(keyed_server)
    fresh.locator("#model-info").filter(has_text="parameters").wait_for()
    assert asked == ["This service needs its API key:"]
    fresh.close()
