"""Durable links, presenter view and the player's keys in headless Chromium (Debian's, driven by Playwright).

The app runs without a model (`--model` names a folder that does not exist): links to recorded examples, the
keys and presenter view need none, and a live run's link then restores its settings without running them. The
last test (slow) starts the app with the real model, to see a live run's link run again.
"""

from __future__ import annotations

import os
import re
from urllib.parse import quote

import pytest

from .app_server import ROOT, served_app

pytestmark = pytest.mark.browser

CHROMIUM = "/usr/bin/chromium"
LOAD_MS = 90_000  # the first restore on a busy 2-core machine
CYCLE = "Cycle (one target forward each)"
PRESENTER_SHOT = ROOT / "assets" / "screenshots" / "presenter.png"
HAIKU = "Write a haiku about a fox in the snow."


@pytest.fixture(scope="module")
def browser():
    playwright = pytest.importorskip("playwright.sync_api")
    with served_app("app-links", "--model", "/nonexistent/model") as url, playwright.sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        yield chromium, url
        chromium.close()


@pytest.fixture
def open_link(browser):
    """A fresh page on `?query`, once the page has restored the link; a dialog (an alert from a script that got
    through) fails the test."""
    chromium, url = browser
    pages = []

    def open_(query: str, **options):
        page = chromium.new_page(viewport={"width": 1280, "height": 900}, **options)
        pages.append(page)
        page.on("dialog", lambda dialog: pytest.fail(f"a dialog opened: {dialog.message}"))
        page.goto(f"{url}?{query}" if query else url)
        page.get_by_role("heading", name="Gumiho: speculative decoding you can watch").wait_for()
        return page

    yield open_
    for page in pages:
        page.close()


def note(page, text: str) -> str:
    """The link's line, once it says `text`."""
    line = page.locator(".prose.gm-link-note").filter(has_text=text)
    line.wait_for(timeout=LOAD_MS)
    return line.inner_text()


def cycle(page) -> str:
    return page.get_by_label(f"number input for {CYCLE}", exact=True).input_value()


def wait_cycle(page, k: int) -> None:
    page.wait_for_function("""([label, k]) => document.querySelector(`input[aria-label="${label}"]`).value === k""",
                           arg=[f"number input for {CYCLE}", str(k)])
    page.get_by_text(re.compile(rf"^Cycle {k} · ")).first.wait_for()
    # and its tree drawn: the step's whole round trip done before the next key (a key pressed while the figure of
    # the previous one was still on its way was once lost on a loaded machine)
    tree_plot(page).locator(".gtitle", has_text=f"Cycle {k}:").first.wait_for()


def tree_plot(page):
    return page.locator(".js-plotly-plot").filter(has_text="bonus (target's token)").first


def test_a_link_restores_the_example_method_and_cycle(open_link):
    page = open_link("tab=explore&example=3-haiku&method=eagle2&cycle=2")
    line = note(page, "Opened the recorded EAGLE-2 run")
    assert line == f"Opened the recorded EAGLE-2 run of “{HAIKU}”, cycle 2."
    assert page.get_by_role("tab", selected=True).inner_text() == "Explore"
    assert page.get_by_role("radio", name="EAGLE-2", exact=True).is_checked()
    wait_cycle(page, 2)
    assert page.get_by_label("Prompt", exact=True).input_value() == HAIKU
    assert "EAGLE-2" in page.get_by_label("Recorded examples", exact=True).input_value()
    assert tree_plot(page).locator(".gtitle").text_content().startswith("Cycle 2:")


def test_a_race_link_opens_the_recorded_race(open_link):
    page = open_link("tab=race&example=1-study-tips")
    note(page, "Opened the recorded race of “Give me three tips")
    assert page.get_by_role("tab", selected=True).inner_text() == "Race"
    assert page.get_by_label("Race prompt", exact=True).input_value().startswith("Give me three tips")


def test_the_arrow_keys_step_the_cycle_and_space_plays_but_not_while_typing(open_link):
    page = open_link("example=3-haiku&method=gumiho&cycle=2")
    note(page, "cycle 2")
    wait_cycle(page, 2)
    page.locator("body").click(position={"x": 5, "y": 5})  # focus on the page itself
    page.keyboard.press("ArrowRight")
    wait_cycle(page, 3)
    page.keyboard.press("ArrowLeft")
    page.keyboard.press("ArrowLeft")
    wait_cycle(page, 1)
    prompt = page.get_by_label("Prompt", exact=True)
    prompt.click()
    for key in ("ArrowRight", "ArrowLeft", "ArrowLeft", " "):
        prompt.press(key)
    page.wait_for_timeout(1500)  # what a key would have changed by now
    typed = prompt.input_value()
    assert cycle(page) == "1" and len(typed) == len(HAIKU) + 1 and typed.count(" ") == HAIKU.count(" ") + 1, \
        "the keys stayed the prompt's"
    assert page.get_by_role("button", name="▶ Play", exact=True).count() == 1
    page.locator("body").click(position={"x": 5, "y": 5})
    page.keyboard.press(" ")
    page.get_by_role("button", name="⏸ Pause", exact=True).wait_for()
    page.keyboard.press(" ")
    page.get_by_role("button", name="▶ Play", exact=True).wait_for()


def test_copy_link_makes_a_link_that_opens_the_same_view(open_link):
    page = open_link("example=2-palindrome-fta&method=eagle2&cycle=1")
    note(page, "cycle 1")
    page.get_by_role("button", name="Copy link", exact=True).first.click()
    box = page.locator("label", has_text="Link to this view").locator("textarea").first
    page.wait_for_function("(box) => box.value.startsWith('http')", arg=box.element_handle())
    link = box.input_value()
    assert re.fullmatch(r"http://127\.0\.0\.1:\d+/\?tab=explore&example=2-palindrome-fta&method=eagle2&cycle=1",
                        link), link
    again = open_link(link.partition("?")[2])
    note(again, "Opened the recorded EAGLE-2 run")
    wait_cycle(again, 1)


def test_a_live_run_link_restores_its_settings_and_says_to_press_generate(open_link):
    page = open_link("prompt=Name+three+fruits.&method=eagle2&seed=7&max_new_tokens=12&top_k=3")
    line = note(page, "Opened a link")
    assert line == "Opened a link: its prompt and settings are in the inputs. Press Generate to run them."
    assert page.get_by_label("Prompt", exact=True).input_value() == "Name three fruits."
    assert page.get_by_role("radio", name="EAGLE-2", exact=True).is_checked()
    assert page.get_by_label("number input for Max new tokens", exact=True).first.input_value() == "12"
    page.get_by_text("Advanced: sampling and draft tree", exact=True).click()
    assert page.get_by_label("Seed (0 to 2^63-1)", exact=True).input_value() == "7"
    top_k = page.get_by_label(re.compile(r"^number input for top-k \(candidates")).input_value()
    assert top_k == "3"


def test_a_bad_link_says_in_one_line_what_it_left_out_and_runs_nothing(open_link):
    script = "<script>window.gmRan = 1; alert(1)</script><img src=x onerror=\"window.gmRan = 2\">"
    page = open_link(f"example=3-haiku&cycle=9999&method=nope&prompt={quote(script)}&%3Cb%3Ex%3C%2Fb%3E=1")
    line = note(page, "Left out")
    assert "\n" not in line.strip()
    for part in ("unknown parameter '<b>x</b>'", "the prompt holds script-like markup: it is kept as plain text",
                 "method must be one of ar, medusa", "got 'nope'", "cycle 9999 is beyond this run"):
        assert part in line, (part, line)
    last = int(re.search(r"cycles 0 to (\d+)", line).group(1))
    wait_cycle(page, last)
    assert page.get_by_label("Prompt", exact=True).input_value() == script, "kept as text"
    page.wait_for_timeout(1000)
    assert page.evaluate("window.gmRan") is None
    assert page.locator(".gm-link-note img, .gm-link-note script, .gm-link-note b").count() == 0


def test_reduced_motion_slows_play_down(open_link):
    page = open_link("", reduced_motion="reduce")
    speed = page.get_by_label("number input for Seconds per cycle (Play)", exact=True)
    page.wait_for_function("(box) => box.value === '3'", arg=speed.element_handle(), timeout=LOAD_MS)


def test_presenter_view_at_1920x1080_is_large_and_hides_the_extras(browser, tmp_path):
    chromium, url = browser
    page = chromium.new_page(viewport={"width": 1920, "height": 1080})
    try:
        page.goto(f"{url}?example=2-palindrome-fta&method=gumiho&cycle=5&present=1")
        note(page, "Opened the recorded Gumiho run")
        page.wait_for_function("document.body.classList.contains('gm-present')")
        for hidden in ("Advanced: sampling and draft tree", "Replay a trace (JSON)", "Download trace (JSON)"):
            assert not page.get_by_text(hidden, exact=True).first.is_visible(), hidden
        assert not page.get_by_text("Limits: prompts up to", exact=False).first.is_visible()
        plot = tree_plot(page)
        plot.wait_for()
        page.wait_for_timeout(1000)  # Plotly's last relayout
        sizes = plot.evaluate("""(root) => [...root.querySelectorAll('svg text')].filter((t) => t.textContent.trim())
            .map((t) => [t.textContent, parseFloat(getComputedStyle(t).fontSize)])""")
        assert sizes and all(size >= 18 for _, size in sizes), [s for s in sizes if s[1] < 18]
        assert plot.evaluate("(root) => parseFloat(getComputedStyle(root.querySelector('.gtitle')).fontSize)") >= 24
        traces = plot.evaluate("""(root) => root.data.map((t) => ({mode: t.mode, marker: t.marker && t.marker.size,
                                                                   line: t.line && t.line.width}))""")
        assert all(size >= 20 for t in traces if "markers" in t["mode"]
                   for size in (t["marker"] if isinstance(t["marker"], list) else [t["marker"]]))
        assert all(t["line"] >= 3 for t in traces if t["mode"] == "lines")
        width = plot.evaluate("(root) => root.getBoundingClientRect().width")
        assert width >= 1920 * 0.9, f"the tree spans the screen: {width}px"
        output = page.locator(".gm-output").first
        assert output.evaluate("(el) => parseFloat(getComputedStyle(el).fontSize)") >= 20
        page.get_by_label(f"number input for {CYCLE}", exact=True).evaluate(
            "(el) => window.scrollTo(0, el.closest('.block').getBoundingClientRect().top + window.scrollY - 10)")
        page.wait_for_timeout(500)
        # The player and the tree, as a room sees them: the shipped shot only when asked for (GUMIHO_RETAKE_SHOTS=1),
        # so that a test run leaves the checkout as it found it.
        page.screenshot(path=str(PRESENTER_SHOT if os.environ.get("GUMIHO_RETAKE_SHOTS") else tmp_path / "shot.png"))

        page.get_by_label("Presenter view: large figures; ← / → step through the cycles, Space plays").uncheck()
        page.wait_for_function("!document.body.classList.contains('gm-present')")
        page.wait_for_function("""() => [...document.querySelectorAll('.js-plotly-plot .gtitle')].some(
            (t) => t.textContent.startsWith('Cycle') && parseFloat(getComputedStyle(t).fontSize) < 18)""")
        assert page.get_by_text("Advanced: sampling and draft tree", exact=True).first.is_visible()
        page.keyboard.press("ArrowRight")  # the focus is on the presenter checkbox: the arrows are the player's
        wait_cycle(page, 6)
    finally:
        page.close()


@pytest.mark.slow
def test_a_live_run_link_runs_again_once_the_model_is_ready(browser):
    """With the real model: the page presses its hidden rerun button, Generate's path runs the link's settings and
    seed, and the cycle the link names is shown at the end."""
    chromium, _ = browser
    with served_app("app-links-model") as url:
        page = chromium.new_page(viewport={"width": 1280, "height": 900})
        try:
            page.goto(url)
            page.get_by_text("Model ready", exact=False).first.wait_for(timeout=600_000)
            # 16 tokens: two cycles at least, so that cycle 1 exists
            page.goto(f"{url}?prompt=Name+three+fruits.&method=gumiho&seed=3&max_new_tokens=16&cycle=1")
            line = note(page, "Opened a link to a live run")
            assert line == ("Opened a link to a live run: the page runs it again with Gumiho, with the link's "
                            "settings and seed 3.")
            page.get_by_text("Done.", exact=True).wait_for(timeout=240_000)
            wait_cycle(page, 1)
            assert page.get_by_text(re.compile(r"^Gumiho · \d+ tokens in \d+ cycles")).count() == 1
        finally:
            page.close()
