"""Task-shaped prompts: ShareGPT first turns that ask for what the six benchmark sets ask for, so that a drafter can
fine-tune on the kind of reply it is judged on.

On the benchmark sets' own outputs the shipped drafters guessed the target's next token far less often than on
ShareGPT's held-out replies (teacher-forced depth-1 accuracy 0.47 against 0.71; docs/training.md, "Task-shaped
data"), while the target was about as sure of its tokens on both: the drafters had met too few replies of those
kinds. The benchmark prompts themselves are for evaluation only: a prompt that shares a run of `NGRAM` words with
any of them is dropped (`overlapping`).
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Iterable
from pathlib import Path

from ..prompts import read_prompt_file
from .data import Conversation, prompt_key

NGRAM = 8  # words in a run shared with a benchmark prompt that drops a prompt

_CODE = re.compile(r"```|\bdef \w+\(|\bfunction\b|\bpython\b|\bjavascript\b|\btypescript\b|\bjava\b|\bc\+\+|\bsql\b"
                   r"|\bcode\b|\bscript\b|\bregex\b|\bclass \w+", re.I)
_MATH = re.compile(r"\bcalculate\b|\bsolve\b|\bhow (?:many|much|long|far)\b|\bequation\b|\bmath|\bpercent|\baverage\b"
                   r"|\bprobability\b|\btotal\b|\d+ ?[+*/×÷^] ?\d+", re.I)
_SUMMARY = re.compile(r"\bsummar|\btl;?dr\b|\b(?:key|main) points\b|\bin (?:a few|\d+) sentences\b", re.I)
_QUESTION = re.compile(r"^(?:who|what|when|where|which|why|how|is|are|was|were|does|did|do|can|name)\b[^\n]*\?$", re.I)
_INSTRUCTION = re.compile(r"^(?:please )?(?:write|give|list|explain|describe|create|generate|suggest|compose|draft"
                          r"|rewrite|classify|identify|translate|compare|provide|outline|brainstorm|design|imagine"
                          r"|tell|make|come up|develop|recommend|edit|convert)\b", re.I)

TASKS = ("summary", "code", "math", "question", "instruction")  # first match wins, in this order


def task_of(prompt: str) -> str | None:
    """The benchmark-like task a first user turn asks for, or None: a summary of a given text (CNN/DM), code
    (HumanEval), arithmetic or a word problem (GSM8K), a short factual question (Natural Questions), a short
    instruction (Alpaca, MT-Bench)."""
    text = prompt.strip()
    split = text.split()
    words = len(split)
    if any(len(word) > 40 for word in split):  # pasted data (base64, URLs, logs), not a request in words
        return None
    if _SUMMARY.search(text) and words >= 60:  # a text to summarise comes with the request
        return "summary"
    if _CODE.search(text):
        return "code"
    if _MATH.search(text) and re.search(r"\d", text) and words <= 150:
        return "math"
    if words <= 25 and _QUESTION.match(text):
        return "question"
    if words <= 60 and _INSTRUCTION.match(text):
        return "instruction"
    return None


def _words(text: str) -> list[str]:
    return re.findall(r"\w+", text.casefold())


def ngrams(text: str, n: int = NGRAM) -> set[tuple[str, ...]]:
    words = _words(text)
    return {tuple(words[i: i + n]) for i in range(len(words) - n + 1)}


def benchmark_ngrams(files: Iterable[Path], n: int = NGRAM) -> set[tuple[str, ...]]:
    """Every run of `n` words of every turn of the given prompt files."""
    found: set[tuple[str, ...]] = set()
    for path in files:
        for record in read_prompt_file(path, "benchmark file"):
            for turn in record.turns:
                found |= ngrams(turn, n)
    return found


def overlapping(prompt: str, banned: set[tuple[str, ...]], n: int = NGRAM) -> bool:
    return not banned.isdisjoint(ngrams(prompt, n))


def _opens_chat(conversation_id: str) -> bool:
    """ShareGPT cuts long chats into parts "abc_0", "abc_1", ...: a later part's first turn leans on the earlier."""
    root, _, part = conversation_id.rpartition("_")
    return not (root and part.isdigit() and part != "0")


def task_prompts(conversations: list[Conversation], per_task: int, banned: set[tuple[str, ...]],
                 tasks: Iterable[str] = TASKS, seed: int = 0) -> list[dict]:
    """Up to `per_task` first user turns of each task (seeded choice), none overlapping `banned`, as
    {"id", "prompt", "task"} records interleaved task by task; one record per distinct prompt."""
    wanted = set(tasks)
    found: dict[str, list[dict]] = {t: [] for t in TASKS if t in wanted}
    seen: set[str] = set()
    for conversation in conversations:
        if not _opens_chat(conversation.id):
            continue
        prompt = next((m["content"] for m in conversation.messages if m["role"] == "user"), "")
        key = prompt_key(conversation)
        task = task_of(prompt)
        if task in found and key not in seen and not overlapping(prompt, banned):
            seen.add(key)
            found[task].append({"id": conversation.id, "prompt": prompt, "task": task})
    rng = random.Random(seed)
    for records in found.values():
        rng.shuffle(records)
        del records[per_task:]
    width = max((len(r) for r in found.values()), default=0)
    return [records[i] for i in range(width) for records in found.values() if i < len(records)]


# Requests to summarise a given text, CNN/DM's kind of task ("Summarize: <article>") in a few wordings.
SUMMARY_REQUESTS = ("Summarize: {text}", "Summarize the following text in a few sentences.\n\n{text}",
                    "{text}\n\nWrite a short summary of the text above.", "Give me the main points of this text:\n\n{text}")
SUMMARY_WORDS = (200, 700)  # the length of a text worth summarising, in words (CNN/DM's articles: about 300-800)


def _prose(text: str) -> bool:
    """Running text: no code, no pasted data, mostly sentences rather than list items."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    listed = sum(bool(re.match(r"^(?:[-*•|#]|\d+[.)])", line)) for line in lines)  # list items, tables, headings
    return "```" not in text and not any(len(word) > 40 for word in text.split()) and listed <= len(lines) // 3


def summary_prompts(conversations: list[Conversation], count: int, banned: set[tuple[str, ...]], seed: int = 0,
                    skip: Iterable[str] = ()) -> list[dict]:
    """Up to `count` synthetic summary tasks: a conversation's first reply of SUMMARY_WORDS words, where it is running
    text (`_prose`), put under a request to summarise it (SUMMARY_REQUESTS, seeded), as {"id", "prompt", "task":
    "summary"} records. ShareGPT has only 168 first turns that ask for a summary of a given text, and CNN/DM, the
    benchmark set the drafters guess worst, asks for nothing else. The id is the conversation's with "-summary" after it, so the record stays on
    its conversation's side of the split; conversations in `skip` (ids) and texts overlapping `banned` are left out."""
    skipped, rng = set(skip), random.Random(seed)
    found: list[dict] = []
    for conversation in conversations:
        if conversation.id in skipped:
            continue
        text = next((m["content"] for m in conversation.messages if m["role"] == "assistant"
                     and SUMMARY_WORDS[0] <= len(m["content"].split()) <= SUMMARY_WORDS[1]), None)
        if text is None or not _prose(text) or overlapping(text, banned):
            continue
        found.append({"id": f"{conversation.id}-summary", "text": text.strip()})
    rng.shuffle(found)
    return [{"id": r["id"], "prompt": rng.choice(SUMMARY_REQUESTS).format(text=r["text"]), "task": "summary"}
            for r in found[:count]]


def write_jsonl(path: Path, records: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for record in records:
            f.write(json.dumps(record, ensure_ascii=False) + "\n")
