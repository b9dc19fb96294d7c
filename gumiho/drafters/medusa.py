"""Medusa-1: independent heads on the frozen target, drafting Medusa's static tree.

Head k reads only the target feature f_j of the last accepted position and proposes depth k + 1 under the root
x_{j+1}. All heads run in one batched call; node (..., r) at depth d takes head d - 1's r-th best token, whatever its
parent, so the tree is a Cartesian product of per-depth lists cut to the official paths. Scores are cumulative
log-probs along each path. Nothing is cached between cycles.
"""

from __future__ import annotations

import torch

from ..tree import DraftPool, TreeSettings
from .base import HeadDrafter
from .config import DrafterConfig
from .heads import MedusaHeads
from .static import StaticDraft


class MedusaDrafter(HeadDrafter):
    kind = "medusa"

    def __init__(self, config: DrafterConfig):
        super().__init__(config)
        self.heads = MedusaHeads(config.mlp_heads, config.mlp_blocks, config.hidden_size)

    def predict(self, features: torch.Tensor, following: torch.Tensor, head: int) -> torch.Tensor:
        return self.heads(features, slice(head, head + 1))[0]  # Medusa's heads ignore the tokens before theirs

    def draft(self, features: torch.Tensor, tokens: torch.Tensor, tree: TreeSettings) -> DraftPool:
        tree_draft = StaticDraft(self.kind, tree, tokens.device)
        plan = tree_draft.plan
        if not plan.depth:
            return tree_draft.pool
        predicted = self.heads(features[-1:].to(self.embed_weight.dtype), slice(0, plan.depth))  # [depth, 1, H]
        values, ids = self.top_tokens(predicted, plan.top_k)  # [depth, 1, top_k]
        for d in range(1, plan.depth + 1):
            rows = len(plan.expanded[d - 2]) if d > 1 else 1  # every parent reads the same list
            tree_draft.add(d, values[d - 1].expand(rows, -1), ids[d - 1].expand(rows, -1), f"medusa-{d}")
        return tree_draft.pool
