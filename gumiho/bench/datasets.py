"""The evaluation prompts: the six Spec-Bench sets (`data/benchmarks/*.jsonl`) or any JSONL file of the same form.

Each line is {"question_id": ..., "turns": ["first user turn", "second user turn", ...]} (a "prompt" key is read as
a single turn). By default only first turns are benchmarked; with both turns, the second turn is asked after the
first turn and AR's answer to it, so every method sees the same conversation.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ..errors import GumihoError

DATASETS = ("mt_bench", "humaneval", "gsm8k", "alpaca", "sum", "qa")
DEFAULT_DIR = Path(__file__).resolve().parents[2] / "data" / "benchmarks"


@dataclass
class Question:
    dataset: str
    question_id: str
    turns: list[str]


def resolve(name: str, folder: Path = DEFAULT_DIR) -> tuple[str, Path]:
    """A dataset name in `folder` or a path to a .jsonl file -> (name, path)."""
    path = Path(name)
    if path.suffix == ".jsonl":
        return path.stem, path
    if name not in DATASETS:
        raise GumihoError(f"unknown dataset {name!r}; choose from {', '.join(DATASETS)} or give a .jsonl path")
    return name, folder / f"{name}.jsonl"


def load_questions(name: str, folder: Path = DEFAULT_DIR, limit: int | None = None) -> list[Question]:
    dataset, path = resolve(name, folder)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise GumihoError(f"cannot read dataset {path}: {getattr(exc, 'strerror', None) or exc}") from exc
    questions = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            turns = record["turns"] if "turns" in record else [record["prompt"]]
        except (json.JSONDecodeError, KeyError, TypeError):
            raise GumihoError(f"{path}:{number}: expected a JSON object with 'turns' (a list) or 'prompt'") from None
        if not isinstance(turns, list) or not turns or not all(isinstance(t, str) and t.strip() for t in turns):
            raise GumihoError(f"{path}:{number}: 'turns' must be a non-empty list of non-empty strings")
        questions.append(Question(dataset, str(record.get("question_id", number)), turns))
        if limit is not None and len(questions) == limit:
            break
    if not questions:
        raise GumihoError(f"{path} holds no prompts")
    return questions


def encode_conversation(tokenizer, turns: list[str]) -> list[int]:
    """Chat-template ids for alternating user / assistant turns (user first), ending with the assistant prompt."""
    messages = [{"role": "assistant" if i % 2 else "user", "content": text} for i, text in enumerate(turns)]
    return list(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                              return_dict=True)["input_ids"])
