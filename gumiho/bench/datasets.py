"""The evaluation prompts: the six Spec-Bench sets (`data/benchmarks/*.jsonl`) or any JSONL file of the same form.

Each line is {"question_id": ..., "turns": ["first user turn", "second user turn", ...]} (a "prompt" key is read as
a single turn). By default only first turns are benchmarked; with both turns, the second turn is asked after the
first turn and AR's answer to it, so every method sees the same conversation.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..errors import GumihoError
from ..prompts import read_prompt_file

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
    return [Question(dataset, record.id, record.turns) for record in read_prompt_file(path, "dataset", limit)]


def encode_conversation(tokenizer, turns: list[str]) -> list[int]:
    """Chat-template ids for alternating user / assistant turns (user first), ending with the assistant prompt."""
    messages = [{"role": "assistant" if i % 2 else "user", "content": text} for i, text in enumerate(turns)]
    return list(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                              return_dict=True)["input_ids"])
