"""Prompt files: JSONL, one conversation's user turns a line, as {"turns": [...]} (the benchmark form) or
{"prompt": "..."} (a single turn). Read by `generate --prompts`, the bench's datasets and the training evaluation."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from .errors import GumihoError


@dataclass
class PromptRecord:
    id: str  # the line's "question_id", else its line number
    turns: list[str]


def read_prompt_file(path: Path, what: str = "prompts file", limit: int | None = None) -> list[PromptRecord]:
    """The first `limit` records (default: all) of a prompt file; `what` names the file in error messages."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise GumihoError(f"cannot read {what} {path}: {getattr(exc, 'strerror', None) or exc}") from exc
    records = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            turns = record["turns"] if "turns" in record else [record["prompt"]]
        except (json.JSONDecodeError, KeyError, TypeError):
            raise GumihoError(f"{path}:{number}: expected a JSON object with 'turns' (a list) or 'prompt'") from None
        if not isinstance(turns, list) or not turns or not all(isinstance(t, str) and t.strip() for t in turns):
            raise GumihoError(f"{path}:{number}: 'turns' must be a non-empty list of non-empty strings "
                              "('prompt' a non-empty string)")
        records.append(PromptRecord(str(record.get("question_id", number)), turns))
        if len(records) == limit:
            break
    if not records:
        raise GumihoError(f"{path} holds no prompts")
    return records


def read_prompts(path: str | Path) -> list[str]:
    """The first user turn of every line of a prompt file."""
    return [record.turns[0] for record in read_prompt_file(Path(path))]
