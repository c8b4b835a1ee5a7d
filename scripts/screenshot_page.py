"""A screenshot of transformer-mt-serve's attention page, taken with headless Chromium.

    transformer-mt-serve --ckpt CKPT --port 8000 &
    python scripts/screenshot_page.py --url http://127.0.0.1:8000 \\
        --text "Ein Mann mit einem orangefarbenen Hut starrt auf etwas." -o docs/serve_page.png

Types the sentence, presses Translate, picks the attention kind, layer and head (``all`` = the
heads of the layer side by side), hovers one output piece and saves the page as PNG. Uses
Debian's ``chromium`` through Playwright (no browser download).
"""

from __future__ import annotations

import argparse
import sys

FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000", help="the running service")
    parser.add_argument("--text", required=True, help="the source sentence")
    parser.add_argument("-o", "--output", required=True, help="PNG to write")
    parser.add_argument(
        "--kind", default="cross", choices=("cross", "encoder_self", "decoder_self")
    )
    parser.add_argument("--layer", default="0", help="layer index")
    parser.add_argument("--head", default="all", help="head index or 'all'")
    parser.add_argument("--hover", type=int, default=1, help="output piece to hover")
    parser.add_argument("--chromium", default="/usr/bin/chromium", help="browser executable")
    parser.add_argument("--width", type=int, default=1280)
    args = parser.parse_args(argv)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=args.chromium, args=FLAGS)
        page = browser.new_page(viewport={"width": args.width, "height": 800})
        page.set_default_timeout(120_000)
        page.goto(args.url)
        page.wait_for_function("document.querySelector('#model-info').textContent.includes('·')")
        page.fill("#source", args.text)
        page.click("#translate")
        page.locator("table.heatmap").first.wait_for()
        page.select_option("#kind", args.kind)
        page.select_option("#layer", args.layer)
        page.select_option("#head", args.head)
        page.hover(f'.out-token[data-index="{args.hover}"]')
        page.screenshot(path=args.output, full_page=True)
        browser.close()
    print(args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
