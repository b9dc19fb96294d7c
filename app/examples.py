"""Example prompts, and the example runs shipped in assets/traces/ (recorded by `python -m app.record_examples`)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from gumiho.trace import DRAFTED_METHODS, GenerationTrace, TraceError

from .style import method_name

log = logging.getLogger(__name__)

TRACES = Path(__file__).resolve().parent.parent / "assets" / "traces"

PROMPTS = [
    "Explain photosynthesis to a ten-year-old in three sentences.",
    "Write a Python function that checks whether a string is a palindrome.",
    "Write a haiku about a fox in the snow.",
    "Give me three tips for staying focused while studying.",
    "What is the difference between weather and climate?",
    "List the planets of the solar system in order from the Sun.",
]


@dataclass(frozen=True)
class Example:
    """One prompt raced through every method: a folder of `<method>.json` traces."""

    name: str
    folder: Path
    traces: tuple[GenerationTrace, ...]

    @property
    def prompt(self) -> str:
        return self.traces[0].prompt

    def trace(self, method: str) -> GenerationTrace:
        return next(t for t in self.traces if t.method == method)

    def path(self, method: str) -> Path:
        return self.folder / f"{method}.json"

    def choices(self) -> list[tuple[str, str]]:
        """(label, key) pairs for a dropdown of its single runs."""
        short = self.prompt if len(self.prompt) <= 48 else self.prompt[:47] + "…"
        return [(f"{method_name(t.method)} · {short}", f"{self.name}/{t.method}") for t in self.traces]


def load_examples(folder: Path = TRACES, order: tuple[str, ...] = (*DRAFTED_METHODS, "ar")) -> list[Example]:
    """Every example folder that holds valid traces, methods in race order; broken files are skipped with a log line."""
    examples = []
    for sub in sorted(p for p in folder.glob("*") if p.is_dir()):
        traces = []
        for method in order:
            path = sub / f"{method}.json"
            if not path.is_file():
                continue
            try:
                traces.append(GenerationTrace.from_json(path.read_text(encoding="utf-8")))
            except (OSError, TraceError) as exc:
                log.warning("skipping example trace %s: %s", path, exc)
        if traces:
            examples.append(Example(name=sub.name, folder=sub, traces=tuple(traces)))
    return examples
