"""Hydra: sequentially dependent heads on the frozen target, drafting Hydra's static tree.

Head k reads [f_j ; e(x_{j+1}) ; e(d_1) ; ... ; e(d_k)]: the target feature f_j of the last accepted position, the
root x_{j+1} and the k draft tokens on the node's own path, and proposes depth k + 1. So, unlike Medusa, a node's
children depend on the tokens above it, and the tree is drafted depth by depth: one call of head d - 1 over every
node of depth d - 1 that has children. Scores are cumulative log-probs along each path. Nothing is cached between
cycles.
"""

from __future__ import annotations

import torch

from ..tree import DraftPool, TreeSettings
from .base import HeadDrafter
from .config import DrafterConfig
from .heads import HydraHeads
from .static import StaticDraft


class HydraDrafter(HeadDrafter):
    kind = "hydra"

    def __init__(self, config: DrafterConfig):
        super().__init__(config)
        self.heads = HydraHeads(config.mlp_heads, config.mlp_blocks, config.hidden_size)

    def predict(self, features: torch.Tensor, following: torch.Tensor, head: int) -> torch.Tensor:
        return self.heads(torch.cat([features, self.embed(following).flatten(1)], -1), head)

    def draft(self, features: torch.Tensor, tokens: torch.Tensor, tree: TreeSettings) -> DraftPool:
        tree_draft = StaticDraft(self.kind, tree, tokens.device)
        plan = tree_draft.plan
        feature, root = features[-1:].to(self.embed_weight.dtype), tokens[-1:]
        rows, following = feature, root[None]  # one row per expanded node; the root's first
        for d in range(1, plan.depth + 1):
            tree_draft.add(d, *self.top_tokens(self.predict(rows, following, d - 1), plan.width(d)), f"hydra-{d}")
            if d == plan.depth:
                break
            fed = len(plan.expanded[d - 1])
            rows = feature.expand(fed, -1)
            following = torch.cat([root.expand(fed, 1), tree_draft.expanded_paths(d)], 1)
        return tree_draft.pool
