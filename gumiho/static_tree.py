"""Static draft trees (EAGLE-1, Medusa, Hydra): a fixed list of paths of top-k ranks, the same every cycle.

A path (2, 0) is "the 3rd candidate at depth 1, then the best candidate under it". The official lists are ordered
so that a node's parent always comes first. Medusa's and Hydra's `mc_sim_7b_63` is ordered by how often each node
was accepted in Medusa's simulation, so its first n entries are the best tree of n nodes; EAGLE-1's (25 nodes,
named mc_sim_7b_63 too) is ordered by depth. A tree budget of n tokens keeps the first n - 1 paths of the list,
as drafters mark with `priority` (tree.DraftPool), so the tree size is chosen by the same cost-driven rule as the
dynamic trees' (choice.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from .errors import GumihoError

# Each path written as its ranks' digits, in the official order (Medusa's medusa_choices.py / Hydra's
# hydra_choices.py mc_sim_7b_63, EAGLE's eagle/model/choices.py mc_sim_7b_63).
_MC_SIM_7B_63 = (
    "0 00 1 01 2 000 10 02 3 03 4 04 20 05 001 5 06 6 07 010 11 7 08 002 30 09 8 9 100 020 12 003 40 21 004 005 "
    "0000 011 006 030 50 13 007 008 009 60 040 14 70 012 200 31 22 80 050 15 101 021 90 060 0001 16 070"
)
_EAGLE1 = "0 1 2 3 00 01 02 10 11 20 21 30 000 001 002 010 011 020 021 100 0000 0001 0002 00000 00001"

CHOICES: dict[str, tuple[tuple[int, ...], ...]] = {
    method: tuple(tuple(int(d) for d in path) for path in text.split())
    for method, text in (("eagle1", _EAGLE1), ("medusa", _MC_SIM_7B_63), ("hydra", _MC_SIM_7B_63))
}
STATIC_METHODS = tuple(CHOICES)


@dataclass(frozen=True)
class StaticLayout:
    """The first paths of a method's list that fit a depth, ready to draft layer by layer.

    paths[i] is node i (the root is not listed); parent[i] indexes paths, -1 under the root; by_depth[d - 1] lists
    the nodes of depth d in list order; top_k is the widest rank used + 1. Drafting depth d + 1 predicts from the
    nodes of depth d that have children, expanded[d - 1] (in list order; the root alone for depth 1): node i reads
    row parent_row[i] of those predictions and takes its rank's candidate. lineage[i] lists the nodes from depth 1
    down to i.
    """

    paths: tuple[tuple[int, ...], ...]
    parent: tuple[int, ...]
    by_depth: tuple[tuple[int, ...], ...]
    top_k: int
    expanded: tuple[tuple[int, ...], ...]
    parent_row: tuple[int, ...]
    lineage: tuple[tuple[int, ...], ...]

    @property
    def depth(self) -> int:
        return len(self.by_depth)

    def rank(self, node: int) -> int:
        return self.paths[node][-1]

    def width(self, depth: int) -> int:
        """Candidates per prediction row that depth `depth` needs: its widest rank + 1."""
        return max(self.rank(i) for i in self.by_depth[depth - 1]) + 1


def choices_for(method: str, depth: int | None = None) -> tuple[tuple[int, ...], ...]:
    """The official paths of `method` in their order, those longer than `depth` left out."""
    if method not in CHOICES:
        raise GumihoError(f"{method} has no static tree; static trees: {', '.join(STATIC_METHODS)}")
    return tuple(p for p in CHOICES[method] if depth is None or len(p) <= depth)


@lru_cache(maxsize=64)
def layout(method: str, depth: int, nodes: int) -> StaticLayout:
    """The first `nodes` paths of `method`'s list no longer than `depth` (a tree budget of nodes + 1 tokens)."""
    paths = choices_for(method, depth)[: max(nodes, 0)]
    index = {p: i for i, p in enumerate(paths)}
    parent = tuple(index[p[:-1]] if len(p) > 1 else -1 for p in paths)
    levels = max((len(p) for p in paths), default=0)
    by_depth = tuple(tuple(i for i, p in enumerate(paths) if len(p) == d) for d in range(1, levels + 1))
    has_children = set(parent)
    expanded = tuple(tuple(i for i in level if i in has_children) for level in by_depth)
    row = {i: r for level in expanded for r, i in enumerate(level)}
    parent_row = tuple(row.get(p, 0) for p in parent)
    lineage = tuple(tuple(index[p[:d]] for d in range(1, len(p) + 1)) for p in paths)
    return StaticLayout(paths, parent, by_depth, max((max(p) for p in paths), default=-1) + 1, expanded, parent_row,
                        lineage)


def capped_total(method: str, depth: int, total_tokens: int) -> int:
    """A shared verification budget as `method`'s static tree can take it: at most its paths no deeper than
    `depth`, plus the root (a race or a bench that gives every method the same budget)."""
    return min(total_tokens, len(choices_for(method, depth)) + 1)
