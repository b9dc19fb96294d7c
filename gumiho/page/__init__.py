"""A folder that replays recorded runs with no server: `python -m gumiho page TRACE.json ... --out DIR`.

index.html holds the runs (gzipped JSON): every cycle's draft tree, the race charts and the coloured texts, built by
the app's own code (app/figures.py, app/render.py, app/views.py), so the page looks like the app. page.js draws them
with the plotly.min.js of the installed plotly package, written beside it, so the page works from file:// with no
network. README.md makes the same folder a Hugging Face Static Space.

Runs are grouped by prompt: each prompt's runs race against each other, never against another prompt's.
"""

from __future__ import annotations

import glob
import gzip
import json
import os
import zipfile
from dataclasses import dataclass
from pathlib import Path
from string import Template

import plotly.graph_objects as go
import plotly.io as pio
from markdown_it import MarkdownIt
from plotly.offline import get_plotlyjs
from plotly.utils import PlotlyJSONEncoder

from app import figures, render
from app.style import CSS
from app.validate import trace_file
from app.views import CycleView, RaceView, showcase_index

from ..errors import GumihoError
from ..trace import DRAFTED_METHODS, GenerationTrace, METHOD_NAMES

HERE = Path(__file__).resolve().parent
RACE_ORDER = (*DRAFTED_METHODS, "ar")  # as the app races them: the drafters in the papers' order, AR last
_markdown = MarkdownIt("commonmark").enable("table")
SPACE_README = """---
title: Gumiho trace replay
emoji: 🦊
colorFrom: indigo
colorTo: pink
sdk: static
app_file: index.html
pinned: false
license: apache-2.0
---

# Gumiho trace replay

$runs of speculative decoding recorded with the Gumiho engine ($methods), replayed in the browser with no server:
each cycle's draft tree, the race charts and the generated texts. Written by `python -m gumiho page`.
"""


@dataclass(frozen=True)
class Page:
    """What `write_page` wrote."""

    folder: Path
    runs: int
    prompts: int
    size: int  # bytes, the four files together


def count(n: int, noun: str) -> str:
    return f"{n} {noun}{'s' if n != 1 else ''}"


def trace_paths(args: list[str]) -> list[str]:
    """The trace files the arguments name. A folder stands for every .json under it; a pattern that the shell
    passed on unexpanded (nothing matched it there, as `assets/traces/*.json` when the runs lie one folder deeper)
    is matched here, in that folder and below. Any other name is kept (`read_traces` says if it is missing)."""
    out: list[str] = []
    for arg in args:
        if Path(arg).is_dir():
            found = sorted(str(p) for p in Path(arg).rglob("*.json"))
            if not found:
                raise GumihoError(f"{arg}: no trace files (*.json) in this folder")
        elif glob.has_magic(arg):
            folder, name = os.path.split(arg)
            found = sorted(glob.glob(arg)) or sorted(glob.glob(os.path.join(folder, "**", name), recursive=True))
            if not found:
                raise GumihoError(f"no file matches {arg}")
        else:
            found = [arg]
        out += found
    return out


def read_traces(paths: list[str]) -> list[GenerationTrace]:
    """Each file as a trace; raises GumihoError naming the first file that is missing or not a trace."""
    traces = []
    for path in paths:
        try:
            traces.append(trace_file(path))
        except GumihoError as exc:
            raise GumihoError(f"{path}: {exc}") from None
    return traces


def group_by_prompt(traces: list[GenerationTrace]) -> list[list[GenerationTrace]]:
    """The runs of each prompt, prompts in the order first given, runs in the app's race order."""
    groups: dict[str, list[GenerationTrace]] = {}
    for trace in traces:
        groups.setdefault(trace.prompt, []).append(trace)
    return [sorted(runs, key=lambda t: RACE_ORDER.index(t.method)) for runs in groups.values()]


def _html(markdown: str) -> str:
    """The app's Markdown (trace text in it escaped by `render.md`) as HTML."""
    return _markdown.render(markdown)


def _plain(figure: go.Figure) -> dict:
    """A figure as data, without its template (the page holds the template once)."""
    data = figure.to_plotly_json()
    data["layout"].pop("template", None)
    return data


def _cycles(trace: GenerationTrace) -> list[dict]:
    if not trace.steps:  # recorded without its trees: the app's note and blank plot
        view = CycleView.of(trace, 0)
        return [{"caption": _html(view.caption), "tree": _plain(view.tree)}]
    return [{"caption": _html(render.cycle_markdown(c)), "tree": figures.tree_spec(c)} for c in trace.steps]


def _labels(traces: list[GenerationTrace]) -> list[str]:
    """The runs' names for the method picker, numbered where a prompt has two runs of one name."""
    names = [figures.run_name(t) for t in traces]
    return [f"{name} ({names[:i].count(name) + 1})" if names.count(name) > 1 else name
            for i, name in enumerate(names)]


def _run(trace: GenerationTrace, label: str) -> dict:
    start = showcase_index(trace)
    return {"label": label, "summary": _html(render.trace_summary(trace)), "legend": render.legend_html(trace),
            "output": render.output_html(trace), "steps": len(trace.steps),
            "start": len(trace.steps) - 1 if start is None else start, "cycles": _cycles(trace)}


def _race(traces: list[GenerationTrace]) -> dict | None:
    if len(traces) < 2:
        return None
    view = RaceView.of(traces)
    return {"headline": _html(view.headline), "table": view.table.to_html(index=False, border=0, classes="gm-table"),
            "timeline": _plain(view.timeline), "tau": _plain(view.tau), "timing": _plain(view.timing),
            "texts": view.texts}


def _group(traces: list[GenerationTrace]) -> dict:
    methods = [t.method for t in traces]
    return {"prompt": traces[0].prompt, "runs": [_run(t, label) for t, label in zip(traces, _labels(traces))],
            "start": methods.index("gumiho") if "gumiho" in methods else 0, "race": _race(traces)}


def mixed_prompts_note(groups: list[list[GenerationTrace]]) -> str:
    if len(groups) < 2:
        return ""
    return (f"These {sum(map(len, groups))} runs come from {len(groups)} different prompts: pick a prompt; only the "
            "runs of one prompt race against each other.")


def page_data(traces: list[GenerationTrace]) -> dict:
    groups = group_by_prompt(traces)
    return {"note": mixed_prompts_note(groups), "template": pio.templates[pio.templates.default].to_plotly_json(),
            "groups": [_group(g) for g in groups]}


def packed(data: dict) -> str:
    """The runs as index.html carries them: JSON, gzipped (every cycle's tree is verbose Plotly data, about ten times
    smaller so), as hex digits: no markup can come out of them, and no word (not even "cdn") can appear in them."""
    text = json.dumps(data, cls=PlotlyJSONEncoder, ensure_ascii=False, separators=(",", ":"))
    return gzip.compress(text.encode(), mtime=0).hex()


def _readme(traces: list[GenerationTrace]) -> str:
    methods = ", ".join(METHOD_NAMES[m] for m in dict.fromkeys(t.method for t in traces))
    return Template(SPACE_README).substitute(runs=count(len(traces), "run"), methods=methods)


def page_files(traces: list[GenerationTrace]) -> dict[str, str]:
    """The page's files by name: index.html with the runs in it, page.js, plotly.min.js and the Space's README.md."""
    if not traces:
        raise GumihoError("no traces to show")
    index = Template((HERE / "template.html").read_text(encoding="utf-8")).substitute(
        css=CSS, data=packed(page_data(traces)))
    return {"index.html": index, "page.js": (HERE / "page.js").read_text(encoding="utf-8"),
            "plotly.min.js": get_plotlyjs(), "README.md": _readme(traces)}


def write_page(traces: list[GenerationTrace], out: Path) -> Page:
    """Write the page's files into `out` (made if missing; other files there are left alone)."""
    if out.exists() and not out.is_dir():
        raise GumihoError(f"--out {out} is a file, not a folder")
    files = page_files(traces)
    try:
        out.mkdir(parents=True, exist_ok=True)
        for name, text in files.items():
            (out / name).write_text(text, encoding="utf-8")
    except OSError as exc:
        raise GumihoError(f"cannot write {out}: {exc.strerror or exc}") from None
    size = sum(len(text.encode()) for text in files.values())
    return Page(out, len(traces), len(group_by_prompt(traces)), size)


def write_zip(traces: list[GenerationTrace], path: Path) -> Path:
    """The page as one zip file holding a folder `gumiho-page/` (the app's download)."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, text in page_files(traces).items():
            archive.writestr(f"gumiho-page/{name}", text)
    return path
