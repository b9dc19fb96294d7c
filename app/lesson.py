"""The "How it works" text (lesson.md), split at its `<!-- figure: NAME -->` markers."""

from __future__ import annotations

import re
from pathlib import Path

LESSON = Path(__file__).with_name("lesson.md")
FIGURE = re.compile(r"^<!-- figure: ([\w-]+) -->$", re.MULTILINE)


def lesson_parts(text: str | None = None) -> list[tuple[str, str | None]]:
    """(markdown, figure name or None) pairs in reading order: each chunk of text, then the figure after it."""
    pieces = FIGURE.split(LESSON.read_text(encoding="utf-8") if text is None else text)
    # split() alternates text and captured names: text, name, text, name, ..., text
    texts, names = pieces[0::2], pieces[1::2] + [None]
    return [(chunk.strip(), name) for chunk, name in zip(texts, names) if chunk.strip() or name]
