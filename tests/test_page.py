"""`python -m gumiho page`: a folder that replays traces with no server; its bad input; escaping; the page in
headless Chromium from file:// with the network blocked."""

from __future__ import annotations

import gzip
import html
import json
import re
import subprocess
import sys
import time
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest

from gumiho.__main__ import main
from app.figures import run_name
from gumiho.page import group_by_prompt, read_traces, trace_paths, write_page, write_zip

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = sorted((ROOT / "assets" / "traces").glob("*/*.json"))  # a folder per prompt, a file per method
PROMPTS = len({p.parent for p in EXAMPLES})
HAIKU = ROOT / "assets" / "traces" / "3-haiku"
CHROMIUM = "/usr/bin/chromium"
EVIL = "<script>alert(1)</script>"
FILES = {"index.html", "page.js", "plotly.min.js", "README.md"}


@pytest.fixture(scope="module")
def examples_page(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess, float]:
    """Every recorded example through the real command line, as the issue words it (`page assets/traces/*.json`,
    the pattern matched by the command): (folder, the finished process, seconds)."""
    out = tmp_path_factory.mktemp("page") / "site"
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "gumiho", "page", "assets/traces/*.json", "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    return out, done, time.perf_counter() - start


@pytest.fixture(scope="module")
def evil_page(tmp_path_factory) -> Path:
    """A trace whose prompt and tokens are markup, beside a run of another prompt."""
    trace = json.loads((HAIKU / "gumiho.json").read_text(encoding="utf-8"))
    trace["prompt"] = EVIL
    trace["steps"][0]["nodes"][0]["text"] = "<img src=x onerror=alert(2)>"
    trace["steps"][0]["bonus_text"] = "</script><script>alert(3)</script>"
    folder = tmp_path_factory.mktemp("evil")
    (folder / "evil.json").write_text(json.dumps(trace), encoding="utf-8")
    traces = read_traces([str(folder / "evil.json"), str(ROOT / "assets" / "traces" / "1-study-tips" / "ar.json")])
    write_page(traces, folder / "site")
    return folder / "site"


def embedded(index: str) -> dict:
    """The runs embedded in an index.html (gzipped JSON in hex digits)."""
    digits = re.search(r'<script type="text/plain" id="gm-data">([0-9a-f]+)</script>', index).group(1)
    return json.loads(gzip.decompress(bytes.fromhex(digits)))


def page_data(folder: Path) -> dict:
    return embedded((folder / "index.html").read_text(encoding="utf-8"))


def cli(capsys, *args: str) -> tuple[int, str]:
    """`python -m gumiho page ARGS` in this process: (exit status, stderr)."""
    try:
        code = main(["page", *args])
    except SystemExit as exc:  # argparse's usage errors
        code = exc.code
    return code, capsys.readouterr().err


# ---------------------------------------------------------------------------------------------- the command


def test_the_examples_make_a_small_self_contained_folder(examples_page):
    out, done, seconds = examples_page
    assert done.returncode == 0, done.stderr
    assert re.fullmatch(rf"wrote .*index\.html: {len(EXAMPLES)} runs of {PROMPTS} prompts, [\d.]+ MB with its "
                        r"assets, in [\d.]+ s\n", done.stderr)
    assert {p.name for p in out.iterdir()} == FILES
    size = sum(p.stat().st_size for p in out.iterdir())
    assert size < 10 * 2**20, f"{size / 2**20:.1f} MiB"
    print(f"page of {len(EXAMPLES)} runs: {size / 1e6:.2f} MB in {seconds:.1f} s (command line included)")
    for name in ("index.html", "page.js"):
        text = (out / name).read_text(encoding="utf-8")
        assert "cdn" not in text.lower() and "https://cdn.plot.ly" not in text
    index = (out / "index.html").read_text(encoding="utf-8")
    assert re.findall(r"<script[^>]*\bsrc=\"([^\"]*)\"", index) == ["plotly.min.js", "page.js"]
    assert "Plotly" in (out / "plotly.min.js").read_text(encoding="utf-8")[:5000]


def test_the_folder_is_a_static_space(examples_page):
    readme = (examples_page[0] / "README.md").read_text(encoding="utf-8")
    front = readme.split("---\n")[1]
    settings = dict(line.split(": ", 1) for line in front.strip().splitlines())
    assert settings["sdk"] == "static" and settings["app_file"] == "index.html"
    assert settings["license"] == "apache-2.0" and settings["title"] and settings["emoji"]


def test_every_cycle_of_every_run_is_in_the_page(examples_page):
    data = page_data(examples_page[0])
    assert f"{PROMPTS} different prompts" in data["note"]
    groups = group_by_prompt(read_traces([str(p) for p in EXAMPLES]))
    assert len(groups) == PROMPTS and all(g[-1].method == "ar" for g in groups)  # the app's order: AR last
    for shown, traces in zip(data["groups"], groups, strict=True):
        assert shown["prompt"] == traces[0].prompt and shown["race"] is not None
        assert [r["label"] for r in shown["runs"]] == [run_name(t) for t in traces]
        for run, trace in zip(shown["runs"], traces):
            assert len(run["cycles"]) == len(trace.steps) == run["steps"]
            assert run["cycles"][1]["tree"]["layout"]["title"]["text"].startswith("Cycle 1:")


def test_a_single_run_has_no_race_and_no_note(tmp_path):
    write_page(read_traces([str(HAIKU / "gumiho.json")]), tmp_path)
    data = page_data(tmp_path)
    assert data["note"] == "" and data["groups"][0]["race"] is None


def test_a_run_recorded_without_its_trees_says_so(tmp_path):
    trace = replace(read_traces([str(HAIKU / "gumiho.json")])[0], steps=[])
    write_page([trace], tmp_path)
    run = page_data(tmp_path)["groups"][0]["runs"][0]
    assert run["steps"] == 0 and len(run["cycles"]) == 1 and "no recorded cycles" in run["cycles"][0]["caption"]
    assert html.escape(trace.text[:20]) in run["output"]


def test_runs_of_different_prompts_still_render_with_a_note(tmp_path, capsys):
    code, err = cli(capsys, str(HAIKU / "ar.json"), str(ROOT / "assets/traces/1-study-tips/gumiho.json"),
                    "--out", str(tmp_path))
    assert code == 0, err
    data = page_data(tmp_path)
    assert data["note"].startswith("These 2 runs come from 2 different prompts")
    assert [len(g["runs"]) for g in data["groups"]] == [1, 1]


@pytest.mark.parametrize("make,message", [
    (lambda d: d / "missing.json", r"missing\.json: cannot read the file: No such file or directory"),
    (lambda d: d, r"no trace files \(\*\.json\) in this folder"),
    (lambda d: d / "*.trace", r"no file matches .*\*\.trace"),
    (lambda d: write(d / "notes.json", "just some notes"), r"notes\.json: not valid JSON"),
    (lambda d: write(d / "other.json", '{"schema": 2, "method": "beam"}'), r"other\.json: unknown method 'beam'"),
    (lambda d: write(d / "list.json", "[1, 2]"), r"list\.json: a trace must be a JSON object"),
])
def test_a_file_that_is_not_a_trace_is_one_line_and_status_2(tmp_path, capsys, make, message):
    code, err = cli(capsys, str(HAIKU / "ar.json"), str(make(tmp_path)), "--out", str(tmp_path / "site"))
    assert code == 2
    assert re.fullmatch(f"error: .*{message}.*\n", err), err
    assert not (tmp_path / "site").exists()


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def test_a_folder_or_an_unexpanded_pattern_names_the_runs_below_it(tmp_path, capsys):
    examples = sorted(str(p) for p in (ROOT / "assets" / "traces").rglob("*.json"))
    assert trace_paths([str(ROOT / "assets" / "traces")]) == examples
    assert trace_paths([str(ROOT / "assets" / "traces" / "*.json")]) == examples, "the issue's own command"
    assert trace_paths([str(HAIKU / "*.json")]) == sorted(str(p) for p in HAIKU.glob("*.json"))
    code, err = cli(capsys, str(ROOT / "assets" / "traces" / "*.json"), "--out", str(tmp_path / "site"))
    assert code == 0 and f"{len(examples)} runs" in err


def test_no_trace_at_all_is_a_usage_error(tmp_path, capsys):
    code, err = cli(capsys, "--out", str(tmp_path))
    assert code == 2
    assert re.fullmatch(r"error: the following arguments are required: TRACE\.json \(see .*\)\n", err)


def test_out_must_be_a_folder(tmp_path, capsys):
    code, err = cli(capsys, str(HAIKU / "ar.json"), "--out", str(write(tmp_path / "taken", "")))
    assert (code, err) == (2, f"error: --out {tmp_path / 'taken'} is a file, not a folder\n")


def test_the_real_process_reports_bad_input_in_one_line(tmp_path):
    done = subprocess.run([sys.executable, "-m", "gumiho", "page", str(tmp_path / "nope.json"), "--out",
                           str(tmp_path / "site")], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("error: ") and "Traceback" not in done.stderr


# ---------------------------------------------------------------------------------------------- escaping


def test_markup_in_a_trace_cannot_become_a_tag(evil_page):
    index = (evil_page / "index.html").read_text(encoding="utf-8")
    scripts = re.findall(r"<script([^>]*)>(.*?)</script>", index, re.S)
    assert index.count("<script") == len(scripts) == 3  # the data, plotly.min.js and page.js
    assert [attributes for attributes, _ in scripts] == [' type="text/plain" id="gm-data"', ' src="plotly.min.js"',
                                                         ' src="page.js"']
    assert re.fullmatch("[0-9a-f]+", scripts[0][1])  # nothing in the data can end the element
    assert "alert" not in index and "<img" not in index
    data = page_data(evil_page)
    group = next(g for g in data["groups"] if g["prompt"] == EVIL)  # the text itself survives, for textContent
    run = group["runs"][0]
    for markup in (run["output"], run["cycles"][0]["caption"], json.dumps(run["cycles"][0]["tree"])):
        assert "<img" not in markup and "<script" not in markup and "</script" not in markup
    assert "&lt;img src=x onerror=alert(2)&gt;" in run["output"]


def test_the_app_download_is_the_same_folder_zipped(tmp_path):
    traces = read_traces([str(HAIKU / "gumiho.json"), str(HAIKU / "ar.json")])
    with zipfile.ZipFile(write_zip(traces, tmp_path / "page.zip")) as archive:
        assert {Path(n).name for n in archive.namelist()} == FILES
        assert {Path(n).parent.name for n in archive.namelist()} == {"gumiho-page"}
        index = archive.read("gumiho-page/index.html").decode()
    write_page(traces, tmp_path / "site")
    assert index == (tmp_path / "site" / "index.html").read_text(encoding="utf-8")


def test_the_app_button_zips_the_shown_runs_without_the_reference_row():
    from app.page_download import NOTHING, READY, page_download

    traces = read_traces([str(HAIKU / "gumiho.json"), str(HAIKU / "ar.json")])
    reference = replace(traces[1], method="transformers-fp32")  # the race's plain generate row: no cycles to draw
    download = page_download("file", "message")  # stand-ins for the components: the keys of what it changes
    shown = download([*traces, reference])
    assert shown["message"] == READY and shown["file"].visible
    with zipfile.ZipFile(shown["file"].value["path"]) as archive:
        data = embedded(archive.read("gumiho-page/index.html").decode())
    assert [r["label"] for r in data["groups"][0]["runs"]] == ["Gumiho", "AR"]
    assert download(None) == download([]) == {"message": NOTHING}


# ---------------------------------------------------------------------------------------------- in a browser


@pytest.fixture(scope="module")
def browser():
    playwright = pytest.importorskip("playwright.sync_api")
    if not Path(CHROMIUM).exists():
        pytest.skip(f"no Chromium at {CHROMIUM}")
    with playwright.sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        yield chromium
        chromium.close()


@pytest.fixture(scope="module")
def offline(browser):
    """A page factory: opens a file:// URL with every other request refused (and recorded)."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    refused: list[str] = []

    def only_files(route):
        if route.request.url.startswith("file://"):
            route.continue_()
        else:
            refused.append(route.request.url)
            route.abort()

    context.route("**/*", only_files)
    errors: list[str] = []
    dialogs: list[str] = []

    def open_page(folder: Path):
        page = context.new_page()
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
        page.goto((folder / "index.html").as_uri())
        page.locator("#gm-tree svg.main-svg").first.wait_for()
        return page

    yield open_page
    context.close()
    assert refused == [] and errors == [] and dialogs == []


@pytest.fixture(scope="module")
def examples_tab(examples_page, offline):
    """The examples' page, one tab for the module's tests, in file order."""
    return offline(examples_page[0])


def tree_state(page) -> tuple[str, str, list[str]]:
    """The cycle label, the tree's title and its node labels, as drawn."""
    return (page.locator("#gm-cycle-label").inner_text(), page.locator("#gm-tree .gtitle").text_content(),
            page.locator("#gm-tree .textpoint text").all_text_contents())



@pytest.mark.browser
def test_the_page_steps_through_cycles_with_the_arrow_keys(examples_tab):
    page = examples_tab
    assert page.locator("#gm-runs button[aria-pressed=true]").inner_text() == "Gumiho"
    page.locator("#gm-cycle").fill("0")
    first = tree_state(page)
    last = re.fullmatch(r"Cycle 0 of (\d+)", first[0]).group(1)
    assert first[1].startswith("Cycle 0:")
    page.keyboard.press("ArrowRight")
    second = tree_state(page)
    assert second[0] == f"Cycle 1 of {last}" and second[1].startswith("Cycle 1:") and second[2] != first[2]
    assert page.locator(".gm-output .gm-cycle.gm-selected").get_attribute("data-cycle") == "1"
    page.keyboard.press("ArrowLeft")
    assert tree_state(page) == first
    # Keys never act while focus is in a text field.
    page.evaluate("() => document.body.append(Object.assign(document.createElement('input'), {id: 'typing'}))")
    page.locator("#typing").press("ArrowRight")
    assert tree_state(page) == first


@pytest.mark.browser
def test_the_page_picks_runs_and_prompts_and_draws_the_race(examples_tab):
    page = examples_tab
    assert page.locator("#gm-note").is_visible()
    for chart in ("gm-timeline", "gm-tau", "gm-timing"):
        assert page.locator(f"#{chart} svg.main-svg").count() >= 1
    assert page.locator("#gm-texts .gm-tok").count() > 100
    page.locator("#gm-runs button", has_text=re.compile("^AR$")).click()
    assert page.locator("#gm-summary").inner_text().startswith("AR ·")
    assert page.locator("#gm-tree .textpoint text").count() == 2  # the AR loop's tree: its root, and the bonus
    haiku = read_traces([str(HAIKU / "ar.json")])[0].prompt
    page.locator("#gm-prompts button", has_text=haiku).click()
    assert page.locator("#gm-prompt").inner_text() == haiku
    assert "Gumiho" in page.locator("#gm-headline").inner_text()


@pytest.mark.browser
def test_markup_from_a_trace_shows_as_text(evil_page, offline):
    page = offline(evil_page)
    assert page.locator("#gm-note").inner_text().startswith("These 2 runs come from 2 different prompts")
    page.locator("#gm-prompts button", has_text="<script>").click()
    assert page.locator("#gm-prompt").inner_text() == EVIL
    assert page.locator("#gm-race").is_hidden()
    page.locator("#gm-cycle").fill("0")
    assert "<img src=x onerror=alert(2)>" in page.locator("#gm-output").inner_text()
    assert page.locator("img").count() == 0
