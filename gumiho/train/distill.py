"""Self-distillation: the target rewrites the assistant replies, so the drafter learns what *this* model writes.

The target answers each conversation's user turns in order, greedily (T = 0, the setting the drafters are measured
in). Turn r's prompt holds the user's first r messages and the target's own r - 1 earlier replies, decoded and
rendered by the chat template: exactly what a multi-turn chat (MT-Bench's second turn) feeds the engine. Each reply
becomes one training sequence, its prompt unmasked.

Two ways to write the replies (a `Replier`): prompts in batches (left-padded) through the lean forward, several
times faster per token than one by one in plain decoding; or one prompt at a time through the engine's own decoding
loop with a speculative method (`engine_replier`), whose greedy output is the path's AR output token for token. On
a CPU the second is the faster: the int4 path's speculation beats a batch of fp32 rows there.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch

from ..errors import GumihoError
from ..target import Target
from .data import Conversation, Rendered, _template_ids

Replier = Callable[[list[list[int]]], list[list[int]]]  # prompts' ids -> the target's greedy replies, in order


SIZED_FOR = 256  # prompt tokens a batch of `batch_size` prompts is sized for


def length_batches(lengths: list[int], batch_size: int, max_new_tokens: int) -> list[list[int]]:
    """Indices in batches of similar length (less padding): at most `batch_size` each, and never more tokens
    (padded prompts + replies) than `batch_size` prompts of SIZED_FOR tokens, so long prompts come in smaller
    batches and memory stays what the batch size was chosen for."""
    budget = batch_size * (SIZED_FOR + max_new_tokens)
    batches: list[list[int]] = []
    for i in sorted(range(len(lengths)), key=lambda i: lengths[i]):
        last = batches[-1] if batches else []
        if last and len(last) < batch_size and (len(last) + 1) * (lengths[i] + max_new_tokens) <= budget:
            last.append(i)
        else:
            batches.append([i])
    return batches


@torch.inference_mode()
def greedy_replies(target: Target, prompts: list[list[int]], max_new_tokens: int, batch_size: int) -> list[list[int]]:
    """The target's greedy reply to each prompt (cut after its first end-of-turn token), in the prompts' order."""
    replies: list[list[int]] = [[] for _ in prompts]
    generate = _lean_batch if target.lean is not None else _transformers_batch
    for batch in length_batches([len(p) for p in prompts], batch_size, max_new_tokens):
        for i, reply in zip(batch, generate(target, [prompts[i] for i in batch], max_new_tokens)):
            replies[i] = reply
    return replies


def batched_replier(target: Target, max_new_tokens: int, batch_size: int) -> Replier:
    return partial(greedy_replies, target, max_new_tokens=max_new_tokens, batch_size=batch_size)


def check_engine_method(method: str, model: str | None) -> None:
    """`prepare --engine METHOD` needs a method exact at T = 0 and, for one with weights, a drafter shipped for the
    model (a random one would only slow the loop down)."""
    from ..drafters import WEIGHT_FREE
    from ..loader import shipped_drafter
    from ..trace import METHODS

    exact = [m for m in METHODS if m != "mjsd"]  # MJSD's joint verification is approximate (docs/design.md §16)
    if method not in exact:
        raise GumihoError(f"--engine {method!r}: choose one of {', '.join(exact)} (exact at T = 0)")
    if method not in ("ar", *WEIGHT_FREE) and shipped_drafter(model, method) is None:
        raise GumihoError(f"no trained {method} drafter ships for {model or 'the default model'}: use --engine ar, "
                          "lookup or recycle")


def engine_replier(target: Target, method: str, max_new_tokens: int) -> Replier:
    """Replies written by the engine's decoding loop with `method` (its shipped drafter where it has weights, the
    automatic trees of the machine's profile), one prompt at a time, greedy: on the fp32 and int4 paths each equals
    the path's AR reply token for token (in half precision, up to rounding: docs/design.md §15)."""
    from ..engine import Engine, GenerationConfig
    from ..loader import choose_trees, load_drafters

    check_engine_method(method, target.name)
    engine = Engine(target)
    if method != "ar":
        for name, (drafter, folder) in load_drafters(target, target.name, {method: None}).items():
            engine.add_drafter(name, drafter, folder)
    choose_trees(engine, lead=method)
    config = GenerationConfig(max_new_tokens=max_new_tokens, trace=False)

    def replies(prompts: list[list[int]]) -> list[list[int]]:
        return [engine.generate("", method, config, prompt_ids=ids).token_ids for ids in prompts]

    return replies


def _left_padded(prompts: list[list[int]], pad: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Prompts left-padded to one width: ids [b, width] and which slots hold a prompt token [b, width]."""
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=device)
    valid = torch.tensor([[False] * (width - len(p)) + [True] * len(p) for p in prompts], device=device)
    return ids, valid


def _lean_batch(target: Target, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    """One batch through the lean forward: the prompts share one KV cache (a row each, left-padded, pads masked), a
    step feeds one token per row, and a row leaves the batch at its end-of-turn token, so no compute is spent on
    finished replies (transformers' `generate` keeps stepping them until the longest is done)."""
    lean, dev = target.lean, target.device
    ids, valid = _left_padded(prompts, 0, dev)
    width = ids.shape[1]
    slots = torch.arange(width, device=dev)
    positions = (slots - (~valid).sum(1, keepdim=True)).clamp(min=0)
    # Causal over the prompt's own slots; a pad slot attends to itself only, so no attention row is empty (an
    # empty row gives NaN values, which would reach the real rows through the zero-weighted pads).
    mask = torch.ones(width, width, dtype=torch.bool, device=dev).tril() & valid[:, None, :]
    mask |= torch.eye(width, dtype=torch.bool, device=dev)
    cache = lean.new_cache(capacity=width + max_new_tokens, batch=len(prompts))
    last = lean.forward(ids, positions, cache, mask)[:, -1]
    position = positions[:, -1]
    rows = torch.arange(len(prompts))  # each live row's index in `prompts`
    replies: list[list[int]] = [[] for _ in prompts]
    for step in range(max_new_tokens):
        tokens = target.logits(last).argmax(-1)
        finished = []
        for row, (r, token) in enumerate(zip(rows.tolist(), tokens.tolist())):
            replies[r].append(token)
            if token in target.eos_ids:
                finished.append(row)
        if step == max_new_tokens - 1 or len(finished) == len(rows):
            break
        if finished:
            done = set(finished)
            live = torch.tensor([i for i in range(len(rows)) if i not in done], device=dev)
            cache.keep_rows(live)
            rows, tokens, valid, position = rows[live.cpu()], tokens[live], valid[live], position[live]
        valid = torch.cat([valid, valid.new_ones(len(rows), 1)], 1)
        position = position + 1
        last = lean.forward(tokens[:, None], position[:, None], cache, valid[:, None, :])[:, -1]
    return replies


def _transformers_batch(target: Target, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    """One batch through transformers' `generate` (targets the lean forward does not run)."""
    tokenizer = target.tokenizer
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(target.eos_ids, default=0)
    ids, valid = _left_padded(prompts, pad, target.device)
    out = target.model.generate(
        input_ids=ids, attention_mask=valid.long(), max_new_tokens=max_new_tokens, do_sample=False,
        pad_token_id=pad, eos_token_id=sorted(target.eos_ids) or None,
    )
    return [_cut_reply(row, target.eos_ids) for row in out[:, ids.shape[1]:].tolist()]


def regenerate(
    target: Target,
    conversations: list[Conversation],
    replier: Replier,
    max_prompt_len: int = 256,
    turns: int = 1,
) -> list[Rendered]:
    """One sequence per reply: the prompt ids and the target's greedy reply to it (written by `replier`), for each
    conversation's first `turns` user messages. The mask covers the reply (up to and including the end-of-turn
    token). A conversation ends at its first prompt longer than `max_prompt_len` tokens or at its first empty
    reply."""
    tokenizer = target.tokenizer
    users = [[m["content"] for m in c.messages if m["role"] == "user"] for c in conversations]
    history: list[list[dict[str, str]]] = [[] for _ in conversations]  # by position: ids need not be unique
    alive = list(range(len(conversations)))
    rendered = []
    for turn in range(turns):
        asked = []
        for i in alive:
            if turn < len(users[i]):
                messages = history[i] + [{"role": "user", "content": users[i][turn]}]
                ids = _template_ids(tokenizer, messages, True)
                if len(ids) <= max_prompt_len:
                    asked.append((i, messages, ids))
        replies = replier([ids for _, _, ids in asked])
        alive = []
        for (i, messages, ids), reply in zip(asked, replies):
            if not reply:
                continue
            cid = conversations[i].id
            name = cid if turn == 0 else f"{cid}/turn{turn + 1}"
            rendered.append(Rendered(id=name, input_ids=ids + reply, loss_mask=[0] * len(ids) + [1] * len(reply)))
            text = tokenizer.decode([t for t in reply if t not in target.eos_ids], skip_special_tokens=True)
            history[i] = messages + [{"role": "assistant", "content": text}]
            alive.append(i)
    return rendered


def _cut_reply(row: list[int], eos_ids: set[int]) -> list[int]:
    for i, token in enumerate(row):
        if token in eos_ids:
            return row[: i + 1]
    return row
