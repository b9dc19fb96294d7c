"""EAGLE-1: EAGLE-2's feature-level draft, grown into EAGLE-1's static tree (static_tree.py) instead of a dynamic one.

The network and its weights are EAGLE-2's (the papers reuse them too). Each cycle drafts the same tree shape:
depth by depth, the nodes that have children in the static tree are fed to the draft at one position (each seeing
its own ancestors), and child (..., r) is the r-th best token of its parent's prediction.
"""

from __future__ import annotations

import torch

from ..tree import DraftPool, TreeSettings
from .eagle2 import Eagle2Drafter
from .static import StaticDraft


class Eagle1Drafter(Eagle2Drafter):
    kind = "eagle1"
    weights = "eagle2"  # the folder kind it loads (drafters.for_method)

    def draft(self, features: torch.Tensor, tokens: torch.Tensor, tree: TreeSettings) -> DraftPool:
        tree_draft = StaticDraft(self.kind, tree, tokens.device)
        plan = tree_draft.plan
        out = self.advance(features, tokens)[None]  # the draft outputs of the expanded nodes; the root's first
        stable, dev = self.cache.length, tokens.device
        slots: list[int] = []  # expansion slot -> node fed there
        for d in range(1, plan.depth + 1):
            tree_draft.add(d, *self.top_tokens(out, plan.width(d)), f"eagle-{d}")
            if d == plan.depth:
                break
            fed = plan.expanded[d - 1]  # the nodes whose children come next, each with its parent's output
            inputs = out[[plan.parent_row[i] for i in fed]]
            fused = self.transformer.fuse(self.embed(tree_draft.tokens[list(fed)]), inputs)
            slots += fed
            own = torch.tensor([[s in plan.lineage[i] for s in slots] for i in fed], dtype=torch.bool, device=dev)
            out = self.expand(fused, stable + d - 1, stable, own)
        return tree_draft.pool

