"""Self-distillation: the target rewrites the assistant replies, so the drafter learns what *this* model writes.

Only the first user turn is kept as the prompt; the target answers it greedily (T = 0, the setting the drafters
are measured in). Prompts run in batches (left-padded), which is several times faster per token than one by one.
"""

from __future__ import annotations

import torch

from ..target import Target
from .data import Conversation, Rendered, _template_ids


@torch.inference_mode()
def regenerate(
    target: Target,
    conversations: list[Conversation],
    max_prompt_len: int = 256,
    max_new_tokens: int = 192,
    batch_size: int = 16,
) -> list[Rendered]:
    """Prompt ids + the target's greedy reply for each conversation's first user turn; prompts that are too long
    are skipped. The mask covers the reply (up to and including the end-of-turn token)."""
    tokenizer, dev = target.tokenizer, target.device
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(target.eos_ids)
    prompts = []
    for conversation in conversations:
        ids = _template_ids(tokenizer, conversation.messages[:1], True)
        if len(ids) <= max_prompt_len:
            prompts.append((conversation.id, ids))
    prompts.sort(key=lambda p: len(p[1]))  # similar lengths share a batch: less padding
    rendered = []
    for start in range(0, len(prompts), batch_size):
        batch = prompts[start: start + batch_size]
        width = max(len(ids) for _, ids in batch)
        input_ids = torch.tensor([[pad] * (width - len(ids)) + ids for _, ids in batch], device=dev)
        attention = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for _, ids in batch], device=dev)
        out = target.model.generate(
            input_ids=input_ids, attention_mask=attention, max_new_tokens=max_new_tokens, do_sample=False,
            pad_token_id=pad, eos_token_id=sorted(target.eos_ids),
        )
        for (cid, ids), row in zip(batch, out[:, width:].tolist()):
            reply = _cut_reply(row, target.eos_ids)
            if reply:
                rendered.append(Rendered(id=cid, input_ids=ids + reply, loss_mask=[0] * len(ids) + [1] * len(reply)))
    return rendered


def _cut_reply(row: list[int], eos_ids: set[int]) -> list[int]:
    for i, token in enumerate(row):
        if token in eos_ids:
            return row[: i + 1]
    return row
