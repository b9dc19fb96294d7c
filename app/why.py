"""Why each draft token passed or failed, read from a cycle's nodes (q, p and, when sampling, the test's threshold and
draw; gumiho/trace.py): each node's state, its explanation, and the numbers along a candidate path."""

from __future__ import annotations

from gumiho.trace import CycleTrace, TraceNode

from .style import token_label

ROOT, ACCEPTED, REJECTED, UNCHECKED = "root", "accepted", "rejected", "not checked"
MISSING = "–"  # a value the trace does not hold (a row the target never computed, an older trace)
PROBABILITY_COLUMNS = ("q (draft)", "p (target)")
TEST_COLUMNS = ("min(1, p′/q′)", "draw")  # sampled cycles only


def sampled(cycle: CycleTrace) -> bool:
    """Whether the cycle was verified by sampling (its tests recorded a draw)."""
    return any(n.draw is not None for n in cycle.nodes)


def node_states(cycle: CycleTrace) -> dict[int, str]:
    """Node id -> ROOT, ACCEPTED, REJECTED (the target checked it and said no) or UNCHECKED (under a rejected node,
    or, when sampling, after a sibling that passed). MJSD checks every prefix of its chain, so every node past the
    accepted prefix was rejected."""
    accepted = set(cycle.accepted_nodes)
    tested = sampled(cycle)
    states = {}
    for node in cycle.nodes:
        if node.parent < 0:
            states[node.id] = ROOT
        elif node.id in accepted:
            states[node.id] = ACCEPTED
        elif cycle.joint or (node.parent in accepted and (not tested or node.draw is not None)):
            states[node.id] = REJECTED
        else:
            states[node.id] = UNCHECKED
    return states


def number(value: float | None) -> str:
    return MISSING if value is None else f"{value:.3g}"


def target_choice(cycle: CycleTrace, node: TraceNode) -> str | None:
    """Greedy: the token the target picked after `node`'s parent (the accepted sibling, or the bonus token after the
    accepted path's last node); None when the parent was not on the accepted path."""
    path = cycle.accepted_nodes
    if node.parent not in path:
        return None
    at = path.index(node.parent)
    return cycle.nodes[path[at + 1]].text if at + 1 < len(path) else cycle.bonus_text


def reason(cycle: CycleTrace, node: TraceNode, state: str) -> str:
    """One line: why the target kept or dropped this node's token."""
    if state == ROOT:
        return "the token already decided (the previous cycle's bonus, or the prefill's)"
    if state == UNCHECKED:
        return ("not tested: a sibling before it passed" if sampled(cycle) and node.parent in cycle.accepted_nodes
                else "not checked: a node above it was rejected")
    if cycle.joint:
        return "in the accepted prefix" if state == ACCEPTED else "past the longest prefix that passed the joint test"
    if node.draw is not None:
        verdict = "<" if state == ACCEPTED else "≥"
        return f"draw {number(node.draw)} {verdict} min(1, p′/q′) = {number(node.accept)}"
    if state == ACCEPTED:
        return "the target's own top token here"
    choice = target_choice(cycle, node)
    return "not the target's top token" + ("" if choice is None else f" (it picked “{token_label(choice, 16)}”)")


def hover_lines(cycle: CycleTrace, node: TraceNode, state: str) -> list[str]:
    """The node's probabilities and verdict, for the tree's hover text."""
    if state == ROOT:
        return [reason(cycle, node, state)]
    mark = {ACCEPTED: "✓ accepted", REJECTED: "✗ rejected", UNCHECKED: "· " + UNCHECKED}[state]
    return [f"q (draft) {number(node.q)} · p (target) {number(node.p)}", f"{mark}: {reason(cycle, node, state)}"]


def path_columns(cycle: CycleTrace, nodes: list[int]) -> dict[str, str]:
    """A candidate path's numbers, token by token as its tokens are listed (root excluded): q and p, and when
    sampling, each test's min(1, p′/q′) and draw."""
    picked = [cycle.nodes[i] for i in nodes[1:]]
    values = [[n.q for n in picked], [n.p for n in picked]]
    names = PROBABILITY_COLUMNS
    if sampled(cycle):
        values += [[n.accept for n in picked], [n.draw for n in picked]]
        names += TEST_COLUMNS
    return {name: " → ".join(number(v) for v in column) for name, column in zip(names, values)}
