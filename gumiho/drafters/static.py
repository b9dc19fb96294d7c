"""A static tree (static_tree.py) drafted depth by depth into a `DraftPool`: EAGLE-1, Medusa and Hydra share it.

Depth d is drafted from prediction rows, one per node of depth d - 1 that has children (`StaticLayout.expanded`;
the root's single row for d = 1). Node (..., r) takes the r-th best candidate of its parent's row, its score is the
cumulative log-prob along its path, and its priority is -node index, so `build_tree` keeps exactly the first
total_tokens - 1 paths of the official list, in its order.
"""

from __future__ import annotations

from functools import lru_cache

import torch

from ..static_tree import StaticLayout, layout
from ..tree import DraftPool, TreeSettings


class StaticDraft:
    """The tree being drafted: every node's token, cumulative score and pool index so far."""

    def __init__(self, method: str, tree: TreeSettings, device: torch.device):
        self.plan = layout(method, tree.depth, tree.total_tokens - 1)
        self.device = device
        n = len(self.plan.paths)
        self.pool = DraftPool()
        self.tokens = torch.zeros(n, dtype=torch.long, device=device)
        self.scores = torch.zeros(n, device=device)
        self.pooled = torch.zeros(n, dtype=torch.long, device=device)

    def add(self, depth: int, values: torch.Tensor, ids: torch.Tensor, source: str) -> None:
        """Depth `depth` from its prediction rows' top candidates: log-probs and token ids, [rows, >= width]."""
        nodes, parents, rows, ranks = _level(self.plan, depth, self.device)
        self.tokens[nodes] = ids[rows, ranks]
        root = parents < 0
        above = parents.clamp(min=0)
        self.scores[nodes] = torch.where(root, 0.0, self.scores[above]) + values[rows, ranks]
        self.pooled[nodes] = self.pool.add(self.tokens[nodes], torch.where(root, -1, self.pooled[above]),
                                           self.scores[nodes], source, depth, priority=-nodes.float())

    def expanded_paths(self, depth: int) -> torch.Tensor:
        """The draft tokens from depth 1 down to each expanded node of depth `depth`: [len(expanded), depth]."""
        return self.tokens[_lineage(self.plan, depth, self.device)]


@lru_cache(maxsize=256)
def _level(plan: StaticLayout, depth: int, device: torch.device) -> tuple[torch.Tensor, ...]:
    """Depth `depth`'s node indices, their parents, the prediction row and the rank each one takes; made once per
    tree shape and device, since the same tree is drafted every cycle."""
    level = plan.by_depth[depth - 1]
    columns = (list(level), [plan.parent[i] for i in level], [plan.parent_row[i] for i in level],
               [plan.rank(i) for i in level])
    return tuple(torch.tensor(c, device=device) for c in columns)


@lru_cache(maxsize=256)
def _lineage(plan: StaticLayout, depth: int, device: torch.device) -> torch.Tensor:
    return torch.tensor([plan.lineage[i] for i in plan.expanded[depth - 1]], device=device)
