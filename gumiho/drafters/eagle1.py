"""EAGLE-1: EAGLE-2's feature-level draft, grown into EAGLE-1's static tree (static_tree.py) instead of a dynamic one.

The network and its weights are EAGLE-2's (the papers reuse them too). Each cycle drafts the same tree shape:
depth by depth, the nodes that have children in the static tree are fed to the draft at one position (each seeing
its own ancestors), and child (..., r) is the r-th best token of its parent's prediction.
"""

from __future__ import annotations

import torch

from ..static_tree import layout
from ..tree import DraftPool, TreeSettings
from .eagle2 import Eagle2Drafter


class Eagle1Drafter(Eagle2Drafter):
    kind = "eagle1"
    weights = "eagle2"  # the folder kind it loads (drafters.for_method)

    def draft(self, features: torch.Tensor, tokens: torch.Tensor, tree: TreeSettings) -> DraftPool:
        plan = layout(self.kind, tree.depth, tree.total_tokens - 1)
        h = self.advance(features, tokens)
        stable, dev = self.cache.length, tokens.device
        pool = DraftPool()
        n = len(plan.paths)
        token, score = torch.zeros(n, dtype=torch.long, device=dev), torch.zeros(n, device=dev)
        pooled = torch.zeros(n, dtype=torch.long, device=dev)
        out = h[None]  # the draft output each node's children are predicted from; the root's first
        row = {-1: 0}  # node -> its row in `out`
        slots: list[int] = []  # expansion slot -> node fed there
        has_children = set(plan.parent)
        for d, level in enumerate(plan.by_depth, start=1):
            nodes = torch.tensor(level, device=dev)
            parents = [plan.parent[i] for i in level]
            under = torch.tensor(parents, device=dev)
            ranks = torch.tensor([plan.rank(i) for i in level], device=dev)
            width = int(ranks.max()) + 1
            values, ids = self.top_tokens(out[[row[p] for p in parents]], width)
            pick = torch.arange(len(level), device=dev)
            token[nodes] = ids[pick, ranks]
            root = under < 0
            score[nodes] = torch.where(root, 0.0, score[under.clamp(min=0)]) + values[pick, ranks]
            parent_pool = torch.where(root, -1, pooled[under.clamp(min=0)])
            pooled[nodes] = pool.add(token[nodes], parent_pool, score[nodes], f"eagle-{d}", d,
                                     priority=-nodes.float())
            if d == plan.depth:
                break
            fed = [i for i in level if i in has_children]  # the nodes whose children come next
            inputs = torch.stack([out[row[plan.parent[i]]] for i in fed])
            fused = self.transformer.fuse(self.embed(token[fed]), inputs)
            slots += fed
            own = torch.tensor([[self._is_ancestor(s, i, plan.parent) for s in slots] for i in fed],
                               dtype=torch.bool, device=dev)
            out = self.expand(fused, stable + d - 1, stable, own)
            row = {i: r for r, i in enumerate(fed)}
        return pool

    @staticmethod
    def _is_ancestor(node: int, of: int, parent: tuple[int, ...]) -> bool:
        """Whether `node` is `of` or one of its ancestors."""
        while of >= 0:
            if of == node:
                return True
            of = parent[of]
        return False
