"""Read the benchmark harness's results from assets/bench/ (written by `python -m gumiho bench`).

A run `<name>` is `<name>.json` with its companions `<name>.md` (the report) and `<name>.summary.csv` etc. The
JSON's `summary` rows (temperature, method, dataset, tau, speedup, accept_1..7, ...) feed the charts. A run still
in progress is read from its journal `<name>.partial.jsonl` (the prompts finished so far). Anything
else is shown as plainly as possible: a CSV without a run is a table, a JSON without `summary` becomes tables
(lists of records) and notes (scalars). Unreadable files become notes, never errors.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from gumiho.bench.metrics import summarize
from gumiho.bench.progress import read_progress
from gumiho.bench.report import speed_table
from gumiho.errors import GumihoError

BENCH = Path(__file__).resolve().parent.parent / "assets" / "bench"
QUICK_COMMAND = "python -m gumiho bench --quick"
SUMMARY_COLUMNS = {"temperature", "method", "dataset", "tau", "speedup"}


@dataclass
class BenchRun:
    """One results file and what came with it."""

    name: str
    report: str = ""  # the harness's Markdown report, when there is one
    summary: pd.DataFrame | None = None  # one row per (temperature, method, dataset)
    tables: list[tuple[str, pd.DataFrame]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    prompts: int = 0  # conversations measured per method (a harness run), so the largest run is listed first
    created: str = ""  # the harness's ISO timestamp: file times are the clone's, not the run's


def _records(value) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(v, dict) for v in value)


def _scalar(value) -> bool:
    return value is None or isinstance(value, (str, int, float, bool))


def _generic(run: BenchRun, title: str, value, depth: int = 0) -> None:
    """Tables from lists of records, notes from scalars, descending two levels into objects."""
    if _records(value):
        run.tables.append((title, pd.json_normalize(value)))
    elif isinstance(value, dict) and depth < 2:
        for key, item in value.items():
            _generic(run, f"{title} › {key}" if title else str(key), item, depth + 1)
    elif _scalar(value):
        run.notes.append(f"**{title}**: {value}")


def _read_json(path: Path) -> BenchRun:
    run = BenchRun(path.stem)
    data = json.loads(path.read_text(encoding="utf-8"))
    summary = data.get("summary") if isinstance(data, dict) else None
    if _records(summary) and SUMMARY_COLUMNS <= set(summary[0]):
        run.summary = pd.DataFrame(summary)
        run.created = str(data.get("created", ""))
        if "prompts" in run.summary:
            measured = run.summary[run.summary["dataset"] != "mean"]
            run.prompts = int(measured.groupby(["temperature", "method"])["prompts"].sum().max())
        report = path.with_suffix(".md")
        run.report = report.read_text(encoding="utf-8") if report.is_file() else ""
        if not run.report:
            run.tables.append(("summary", run.summary))
    else:
        _generic(run, "", data)
    return run


def _read_journal(path: Path) -> BenchRun:
    """A run in progress: the harness journals each finished conversation in `<name>.partial.jsonl`."""
    name = path.name.removesuffix(".partial.jsonl") + " (in progress)"
    try:
        progress = read_progress(path)
    except (OSError, UnicodeDecodeError, ValueError, KeyError, GumihoError) as exc:
        return BenchRun(name, notes=[f"could not read `{path.name}`: {exc}"])
    notes = [f"**In progress:** {progress.describe()} The tables grow as the run goes on."]
    if progress.rows.empty:
        return BenchRun(name, notes=notes)
    summary = summarize(progress.rows)
    report = "\n\n".join(f"**T = {t:g}, conversations done so far**\n\n{speed_table(summary, t)}"
                         for t in sorted(summary["temperature"].unique()))
    return BenchRun(name, report=report, summary=summary, notes=notes)


def read_runs(folder: Path = BENCH) -> list[BenchRun]:
    """Runs in progress (journals) first, then every finished run in `folder`, the newest first (the engine changes
    between runs: an older run, however large, measured an older engine); then other files."""
    if not folder.is_dir():
        return []
    files = sorted(folder.glob("*.json"))
    runs = []
    for path in files:
        try:
            runs.append(_read_json(path))
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            runs.append(BenchRun(path.stem, notes=[f"could not read `{path.name}`: {exc}"]))
    runs.sort(key=lambda run: run.created, reverse=True)
    runs[:0] = [_read_journal(path) for path in sorted(folder.glob("*.partial.jsonl"))]
    owned = tuple(f"{p.stem}." for p in files)
    for path in sorted(folder.glob("*.csv")):
        if path.name.startswith(owned):
            continue  # a companion of a run above (the same data as its JSON)
        try:
            runs.append(BenchRun(path.stem, tables=[("", pd.read_csv(path))]))
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            runs.append(BenchRun(path.stem, notes=[f"could not read `{path.name}`: {exc}"]))
    return runs


def task_rows(summary: pd.DataFrame, temperature: float) -> list[dict]:
    """The per-task rows (not the "mean" rows) at one temperature."""
    rows = summary[(summary["temperature"] == temperature) & (summary["dataset"] != "mean")]
    return rows.to_dict("records")


def acceptance_rows(summary: pd.DataFrame, temperature: float) -> dict[str, list[float]]:
    """Per method, the acceptance rate at draft depth 1, 2, ... averaged over the tasks ("mean" rows)."""
    means = summary[(summary["temperature"] == temperature) & (summary["dataset"] == "mean")]
    depths = sorted(int(c.split("_")[1]) for c in summary.columns if c.startswith("accept_"))
    return {row["method"]: [row[f"accept_{d}"] for d in depths] for row in means.to_dict("records")
            if row["method"] != "ar"}
