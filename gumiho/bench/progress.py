"""How far a journaled benchmark run has got: `python -m gumiho bench --name NAME --status`, and the app's
Benchmarks tab for a run in progress. Reads the journal only; no model is loaded.

Counts are of conversations (a prompt with every method run on it, per temperature and seed). A conversation whose
CPU share says it was disturbed counts as not done, exactly as `--resume` will treat it.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from ..errors import GumihoError
from .datasets import DEFAULT_DIR, load_questions
from .harness import BenchSettings
from .journal import Journal


@dataclass
class Progress:
    command: str  # the command that started the run (add --resume to continue it)
    done: dict[str, int]  # finished conversations per dataset, in run order
    total: dict[str, int] | None  # conversations per dataset in the whole run (None: the prompt files are missing)
    redo: int  # finished, but disturbed: measured again on resume
    processes: int  # processes that have worked on the run
    measured_s: float  # measuring time so far, summed over those processes
    per_conversation_s: float | None  # median wall time of one finished conversation
    rows: pd.DataFrame  # per-prompt rows of the finished conversations

    @property
    def remaining(self) -> int | None:
        return None if self.total is None else sum(self.total.values()) - sum(self.done.values())

    @property
    def eta_s(self) -> float | None:
        if self.remaining is None or self.per_conversation_s is None:
            return None
        return self.remaining * self.per_conversation_s

    def describe(self) -> str:
        """One paragraph: counts per dataset, time so far and time to go, and how to continue."""
        if self.total is None:
            counts = ", ".join(f"{d}: {n}" for d, n in self.done.items())
            head = f"{sum(self.done.values())} conversations done ({counts or 'none yet'})"
        else:
            counts = ", ".join(f"{d}: {self.done.get(d, 0)}/{n}" for d, n in self.total.items())
            head = f"{sum(self.done.values())} of {sum(self.total.values())} conversations done ({counts})"
        if self.redo:
            head += f"; {self.redo} disturbed, to be measured again"
        parts = [head, f"{_hours(self.measured_s)} of measuring over {self.processes} process"
                       f"{'es' if self.processes != 1 else ''}"]
        if self.per_conversation_s is not None:
            parts.append(f"{self.per_conversation_s:.0f} s per conversation")
        if self.eta_s is not None:
            parts.append(f"about {_hours(self.eta_s)} to go")
        return "; ".join(parts) + f". Continue it with `{self.command} --resume`."


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h" if seconds >= 3600 else f"{seconds / 60:.0f} min"


def read_progress(path: Path, data_dir: Path = DEFAULT_DIR) -> Progress:
    """The progress of the run journaled at `path`; its prompt files are looked up in `data_dir`."""
    journal = Journal.read(path)
    settings = BenchSettings(**{**journal.identity["settings"], "data_dir": data_dir})
    try:
        questions = [load_questions(name, data_dir, settings.limit) for name in settings.datasets]
        total = {qs[0].dataset: len(qs) * len(settings.runs()) for qs in questions}
    except GumihoError:
        total = None
    done: dict[str, int] = {}
    for dataset, *_ in journal.done:
        done[dataset] = done.get(dataset, 0) + 1
    walls = [r["wall_s"] for r in journal.records if tuple(r["job"]) in journal.done]
    return Progress(command=journal.setup.get("command", "python -m gumiho bench ..."), done=done, total=total,
                    redo=journal.redo, processes=journal.segment, measured_s=journal.measured_s(),
                    per_conversation_s=statistics.median(walls) if walls else None,
                    rows=pd.DataFrame([row for rows in journal.done.values() for row in rows]))
