"""The "How it works" text (lesson.md), split at its `<!-- figure: NAME -->` markers, and the recorded cycle it
explains node by node."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

from gumiho.trace import CycleTrace

from . import why
from .examples import Example
from .render import md, md_code
from .style import token_label
from .views import showcase_cycle

LESSON = Path(__file__).with_name("lesson.md")
FIGURE = re.compile(r"^<!-- figure: ([\w-]+) -->$", re.MULTILINE)


def lesson_parts(text: str | None = None) -> list[tuple[str, str | None]]:
    """(markdown, figure name or None) pairs in reading order: each chunk of text, then the figure after it."""
    pieces = FIGURE.split(LESSON.read_text(encoding="utf-8") if text is None else text)
    # split() alternates text and captured names: text, name, text, name, ..., text
    texts, names = pieces[0::2], pieces[1::2] + [None]
    return [(chunk.strip(), name) for chunk, name in zip(texts, names) if chunk.strip() or name]


def lesson_cycle(method: str, showcase: Example, examples: list[Example]) -> tuple[Example, CycleTrace] | None:
    """The recorded cycle the lesson draws for `method`: the showcase cycle of its run in the showcase example, else
    in the first example that ran it, among the cycles its own drafter drafted (a learned drafter's run also
    verifies prompt lookup's trees where the text repeats); None when no example did."""
    example = next((e for e in [showcase, *examples] if any(t.method == method for t in e.traces)), None)
    if example is None:
        return None
    trace = example.trace(method)
    own = [c for c in trace.steps if method == "lookup" or any(n.source not in ("root", "lookup") for n in c.nodes)]
    cycle = showcase_cycle(replace(trace, steps=own or trace.steps))
    return (example, cycle) if cycle else None


def walkthrough(example: Example, cycle: CycleTrace) -> str:
    """One recorded cycle, node by node (Markdown): each draft token's q and p and why the target kept or dropped
    it, then the bonus token."""
    states = why.node_states(cycle)
    rows = []
    for node in cycle.nodes[1:]:
        parent = cycle.nodes[node.parent]
        mark = {why.ACCEPTED: "✓", why.REJECTED: "✗", why.UNCHECKED: "·"}[states[node.id]]
        rows.append(f"| {node.id} | {md_code(token_label(node.text, 16))} | {md_code(token_label(parent.text, 16))} | "
                    f"{md(node.source)} | {why.number(node.q)} | {why.number(node.p)} | "
                    f"{mark} {md(why.reason(cycle, node, states[node.id]))} |")
    accepted = [cycle.nodes[i] for i in cycle.accepted_nodes[1:]]
    last = cycle.nodes[cycle.accepted_nodes[-1]]
    kept = ", ".join(md_code(token_label(n.text, 16)) for n in accepted) or "no draft token"
    return (f"**Cycle {cycle.index} of the example “{md(example.prompt)}”, node by node** (the Gumiho tree above; "
            "hover its nodes for the same numbers):\n\n"
            "| node | token | after | drafted by | q (draft) | p (target) | verdict |\n|---|---|---|---|---|---|---|\n"
            + "\n".join(rows)
            + f"\n\nThe target kept {kept}, then added its own next token after "
              f"{md_code(token_label(last.text, 16))}, the bonus ★ {md_code(token_label(cycle.bonus_text, 16))}: "
              f"{len(cycle.emitted)} tokens from one forward.")
