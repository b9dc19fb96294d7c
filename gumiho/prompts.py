"""Prompt files: JSONL, one conversation's user turns a line, as {"turns": [...]} (the benchmark form) or
{"prompt": "..."} (a single turn). Read by `generate --prompts`, the bench's datasets, `train eval`, and `train
prepare` for training data that holds prompts only."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from .errors import GumihoError


@dataclass
class PromptRecord:
    id: str  # the line's "question_id", else its line number
    turns: list[str]


def user_turns(record: object) -> list[str] | None:
    """The user turns of one line's record: its 'turns' or its 'prompt'; None unless they are non-empty strings."""
    if not isinstance(record, dict) or ("turns" not in record and "prompt" not in record):
        return None
    turns = record["turns"] if "turns" in record else [record["prompt"]]
    if not isinstance(turns, list) or not turns or not all(isinstance(t, str) and t.strip() for t in turns):
        return None
    return turns


def read_prompt_file(path: Path, what: str = "prompts file", limit: int | None = None) -> list[PromptRecord]:
    """The first `limit` records (default: all) of a prompt file; `what` names the file in error messages."""
    try:
        lines = path.read_text(encoding="utf-8").split("\n")
    except (OSError, UnicodeDecodeError) as exc:
        raise GumihoError(f"cannot read {what} {path}: {getattr(exc, 'strerror', None) or exc}") from exc
    records = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            record = None
        turns = user_turns(record)
        if turns is None:
            raise GumihoError(f"{path}:{number}: expected a JSON object with 'turns' (a non-empty list of non-empty "
                              "strings) or 'prompt' (a non-empty string)")
        records.append(PromptRecord(str(record.get("question_id", number)), turns))
        if len(records) == limit:
            break
    if not records:
        raise GumihoError(f"{path} holds no prompts")
    return records


def read_prompts(path: str | Path) -> list[str]:
    """The first user turn of every line of a prompt file."""
    return [record.turns[0] for record in read_prompt_file(Path(path))]


# Eight generic prompts: `calibrate`'s default, and the profile's texts where data/calibration is not there.
GENERIC_PROMPTS = (
    "Describe how a bicycle works, part by part.",
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "Explain the difference between a list and a tuple in Python, with examples.",
    "What are three good habits for staying healthy while working from home?",
    "Summarise the causes of the French Revolution in a paragraph.",
    "A train leaves at 3 pm and travels 120 km at 80 km/h. When does it arrive? Explain step by step.",
    "Write a polite email asking a colleague to review a document by Friday.",
    "Translate into French: 'The weather is lovely today, let us go for a walk.'",
)
