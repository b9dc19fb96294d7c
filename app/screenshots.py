"""Screenshots of each tab for the README, and of each method's draft tree in the lesson, taken with Playwright and
Debian's Chromium from a running app:

    python app.py --port 7860 &
    python -m app.screenshots --url http://127.0.0.1:7860/
    # writes assets/screenshots/<tab>.png and assets/screenshots/tree-<method>.png

and the Explore tab's tree as a reader with deuteranopia sees it (tree-deuteranopia.png): the page runs the plot
through an SVG colour matrix that simulates it (Machado, Oliveira and Fernandes 2009, severity 1).
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from gumiho.trace import DRAFTED_METHODS, METHOD_NAMES

SCREENSHOTS = Path(__file__).resolve().parent.parent / "assets" / "screenshots"
TABS = {"Explore": "explore", "Race": "race", "Benchmarks": "benchmarks", "How it works": "how-it-works"}
DEUTERANOPIA = ("0.367322 0.860646 -0.227968 0 0  0.280085 0.672501 0.047413 0 0  "
                "-0.011820 0.042940 0.968881 0 0  0 0 0 1 0")  # on linear RGB, as an SVG filter computes
SIMULATE = """(plot, matrix) => {
    document.body.insertAdjacentHTML('beforeend', `<svg width="0" height="0" style="position:absolute"><filter
        id="gm-cvd" color-interpolation-filters="linearRGB"><feColorMatrix type="matrix" values="${matrix}"/>
        </filter></svg>`);
    plot.style.filter = 'url(#gm-cvd)';
}"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m app.screenshots", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default="http://127.0.0.1:7860/")
    parser.add_argument("--chromium", default="/usr/bin/chromium")
    parser.add_argument("--out", type=Path, default=SCREENSHOTS)
    parser.add_argument("--height", type=int, default=1800, help="crop each page to this many pixels")
    args = parser.parse_args(argv)

    from playwright.sync_api import sync_playwright

    args.out.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=args.chromium, args=["--no-sandbox", "--disable-gpu"])
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.goto(args.url)
        page.get_by_text("Model ready", exact=False).first.wait_for(timeout=600_000)
        for tab, name in TABS.items():
            page.get_by_role("tab", name=tab, exact=True).click()
            page.wait_for_timeout(2500)  # let Plotly draw
            height = min(args.height, page.evaluate("document.documentElement.scrollHeight"))
            path = args.out / f"{name}.png"
            page.screenshot(path=str(path), full_page=True, clip={"x": 0, "y": 0, "width": 1280, "height": height})
            print(path)
            if name == "explore":
                _deuteranopia(page, args.out / "tree-deuteranopia.png")
        # The lesson is the open tab now: each method's tree is a plot titled "<name>, cycle N of the example ...".
        for method in DRAFTED_METHODS:
            title = re.compile(rf"^{re.escape(METHOD_NAMES[method])}( \(approximate\))?, cycle")  # MJSD's is marked
            plot = page.locator(".js-plotly-plot").filter(has=page.locator(".gtitle", has_text=title)).first
            if not plot.count():
                print(f"no {METHOD_NAMES[method]} tree in the lesson (no recorded example)")
                continue
            plot.scroll_into_view_if_needed()
            page.wait_for_timeout(500)
            path = args.out / f"tree-{method}.png"
            plot.screenshot(path=str(path))
            print(path)
        browser.close()
    return 0


def _deuteranopia(page, path: Path) -> None:
    """The Explore tab's tree through the deuteranopia filter, saved to `path`; the plot is left unfiltered."""
    plot = page.locator(".js-plotly-plot").filter(has_text="bonus (target's token)").first
    plot.scroll_into_view_if_needed()
    plot.evaluate(SIMULATE, DEUTERANOPIA)
    page.wait_for_timeout(300)
    plot.screenshot(path=str(path))
    plot.evaluate("(plot) => { plot.style.filter = ''; }")
    print(path)


if __name__ == "__main__":
    raise SystemExit(main())
