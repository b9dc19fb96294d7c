"""Numbers and token lists derived from traces (pure functions; figures and HTML are built from these)."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from gumiho.trace import CycleTrace, GenerationTrace, TracePath

SPECIAL_TEXT = re.compile(r"<\|[^|<>]*\|>|</?s>")  # how special tokens (<|im_end|>, </s>) decode


@dataclass(frozen=True)
class Token:
    """One output token and how it was produced."""

    token_id: int
    text: str
    cycle: int  # the cycle that emitted it; -1 for the prefill's first token
    source: str  # "prefill", the drafting head ("serial-1", "mlp-4", "eagle-2", ...) or "bonus"
    borrowed: bool = False  # accepted at a position that Full Tree Attention borrowed from another branch
    special: bool = False  # an end-of-turn or other special token: kept in the trace, hidden in the text


def accepted_path(cycle: CycleTrace) -> TracePath | None:
    """The candidate path the accepted tokens came from."""
    n = len(cycle.accepted_nodes)
    for path in cycle.paths:
        if path.nodes[:n] == cycle.accepted_nodes and path.accepted == n - 1:
            return path
    return None


def cycle_tokens(cycle: CycleTrace) -> list[Token]:
    """The tokens a cycle emitted: accepted draft tokens (with their heads), then the bonus token."""
    nodes = {n.id: n for n in cycle.nodes}
    path = accepted_path(cycle)
    produced = []
    for pos, node_id in enumerate(cycle.accepted_nodes[1:], 1):
        node = nodes.get(node_id)
        borrowed = bool(path and path.filled[pos])
        produced.append(("?" if node is None else node.text, "draft" if node is None else node.source, borrowed))
    produced.append((cycle.bonus_text, "bonus", False))
    return [
        Token(token_id=token_id, text=text, cycle=cycle.index, source=source, borrowed=borrowed)
        for token_id, (text, source, borrowed) in zip(cycle.emitted, produced)
    ]


def output_tokens(trace: GenerationTrace) -> list[Token]:
    """Every output token in order, special ones marked; works on a trace that is still being recorded."""
    if not trace.steps:
        return [Token(token_id=-1, text=trace.text, cycle=-1, source="prefill")] if trace.text else []
    root = trace.steps[0].nodes[0].text if trace.steps[0].nodes else ""
    tokens = [Token(token_id=trace.first_token, text=root, cycle=-1, source="prefill")]
    for cycle in trace.steps:
        tokens.extend(cycle_tokens(cycle))
    ended = len(tokens) - 1 if trace.finish_reason == "eos" else None  # the end-of-turn token, however it decodes
    return [replace(t, special=i == ended or SPECIAL_TEXT.fullmatch(t.text) is not None) for i, t in enumerate(tokens)]


def token_ids(trace: GenerationTrace) -> list[int]:
    """The output ids, from the finished trace or from the cycles recorded so far."""
    if trace.token_ids:
        return trace.token_ids
    return [trace.first_token] + [t for cycle in trace.steps for t in cycle.emitted] if trace.steps else []


def timeline(trace: GenerationTrace) -> tuple[list[float], list[int]]:
    """Cumulative output tokens against elapsed seconds: prefill (first token), then the end of each cycle."""
    seconds, counts = [0.0], [0]
    if trace.first_token < 0:
        return seconds, counts
    elapsed, produced = trace.prefill_ms / 1e3, 1
    seconds.append(elapsed)
    counts.append(produced)
    for cycle in trace.steps:
        elapsed += cycle.total_ms / 1e3
        produced += len(cycle.emitted)
        seconds.append(elapsed)
        counts.append(produced)
    return seconds, counts


def tokens_per_cycle(trace: GenerationTrace) -> list[int]:
    """Tokens each verification forward produced: accepted draft tokens + the bonus token (τ per cycle)."""
    return [cycle.accept_length + 1 for cycle in trace.steps]


def elapsed_s(trace: GenerationTrace) -> float:
    """Wall time of a finished trace, or the time recorded so far."""
    return trace.wall_s or timeline(trace)[0][-1]


def time_shares(trace: GenerationTrace) -> dict[str, float]:
    """Fraction of cycle time spent drafting, verifying and on the rest."""
    totals = {
        "draft": sum(c.draft_ms for c in trace.steps),
        "verify": sum(c.verify_ms for c in trace.steps),
        "other": sum(c.other_ms for c in trace.steps),
    }
    whole = sum(totals.values())
    return {k: (v / whole if whole else 0.0) for k, v in totals.items()}


def first_divergence(ids: list[int], reference: list[int]) -> int | None:
    """Index of the first token where `ids` differs from `reference` (None when one is a prefix of the other)."""
    for i, (a, b) in enumerate(zip(ids, reference)):
        if a != b:
            return i
    return None
