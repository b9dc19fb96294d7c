"""Read the benchmark harness's result files (assets/bench/*.json, *.csv) into tables, whatever their exact shape.

JSON: a list of records is one table; in an object, lists of records and objects of records become tables and
scalars become notes. A CSV file is one table (skipped when a JSON file with the same name exists).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

BENCH = Path(__file__).resolve().parent.parent / "assets" / "bench"
QUICK_COMMAND = "python -m gumiho bench --quick"
TASK_COLUMNS = ("task", "dataset", "benchmark", "bench")
METRIC_WORDS = ("speedup", "speed_up", "speed-up", "tau", "τ", "tokens_per_s")


@dataclass
class BenchTable:
    title: str
    table: pd.DataFrame


@dataclass
class BenchResults:
    tables: list[BenchTable] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _is_records(value) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(v, dict) for v in value)


def _is_scalar(value) -> bool:
    return value is None or isinstance(value, (str, int, float, bool))


def _collect(title: str, value, results: BenchResults, depth: int = 0) -> None:
    if _is_records(value):
        results.tables.append(BenchTable(title, pd.json_normalize(value)))
    elif isinstance(value, dict) and value and all(isinstance(v, dict) for v in value.values()) and all(
            all(_is_scalar(x) for x in v.values()) for v in value.values()):
        table = pd.DataFrame.from_dict(value, orient="index").reset_index(names="name")
        results.tables.append(BenchTable(title, table))
    elif isinstance(value, dict) and depth < 2:
        for key, item in value.items():
            _collect(f"{title} › {key}", item, results, depth + 1)
    elif _is_scalar(value) or (isinstance(value, list) and all(_is_scalar(v) for v in value)):
        results.notes.append(f"**{title}**: {value}")


def read_results(folder: Path = BENCH) -> BenchResults:
    """Everything readable in `folder`; unreadable files become notes, never errors."""
    results = BenchResults()
    if not folder.is_dir():
        return results
    json_stems = {p.stem for p in folder.glob("*.json")}
    for path in sorted(folder.glob("*.json")) + sorted(folder.glob("*.csv")):
        try:
            if path.suffix == ".json":
                _collect(path.stem, json.loads(path.read_text(encoding="utf-8")), results)
            elif path.stem not in json_stems:
                results.tables.append(BenchTable(path.stem, pd.read_csv(path)))
        except (OSError, UnicodeDecodeError, ValueError, pd.errors.ParserError) as exc:
            results.notes.append(f"could not read `{path.name}`: {exc}")
    return results


def chart_columns(table: pd.DataFrame) -> tuple[str, str, list[str]] | None:
    """(task column, method column, metric columns) when the table is in long form (one row per method and task)."""
    lower = {c.lower(): c for c in table.columns}
    task = next((lower[c] for c in TASK_COLUMNS if c in lower), None)
    method = lower.get("method")
    metrics = [c for c in table.columns if any(w in c.lower() for w in METRIC_WORDS)
               and pd.api.types.is_numeric_dtype(table[c])]
    if task is None or method is None or not metrics:
        return None
    return task, method, metrics
