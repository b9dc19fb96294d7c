"""Gumiho: a 2-layer serial Transformer drafts tokens 1-2, parallel MLP heads draft tokens 3.. in one call.

Serial part: the top-k of the Transformer's prediction at the root (serial-1); the k nodes are fed at one
position and the best k of their k x k children are kept (serial-2). Parallel part: for each serial-2 node the
heads read u = [fc(e(t1), h_root) ; fc(e(t2), h1)], the fused inputs of its own chain, and predict one feature per
head. A beam over the heads' independent top-`mlptopk` lists keeps the best `pruning` nodes per depth; only kept
nodes enter the pool. A tree too small to keep deeper nodes stops early (`TreeSettings.drafted_depth`): after
serial-1 for 2 tokens, after serial-2 for 3.
"""

from __future__ import annotations

import torch

from ..errors import GumihoError
from ..tree import DraftPool, TreeSettings
from .base import FeatureDrafter
from .config import DrafterConfig
from .layers import ParallelHeads


class GumihoDrafter(FeatureDrafter):
    kind = "gumiho"

    def __init__(self, config: DrafterConfig):
        super().__init__(config)
        self.heads = ParallelHeads(config)

    def check_tree(self, tree: TreeSettings) -> None:
        if tree.depth - 1 > self.config.mlp_heads:
            raise GumihoError(f"depth {tree.depth} needs {tree.depth - 1} MLP heads; this drafter has "
                              f"{self.config.mlp_heads} (depth at most {self.config.mlp_heads + 1})")

    def draft(self, features: torch.Tensor, tokens: torch.Tensor, tree: TreeSettings) -> DraftPool:
        depth = tree.drafted_depth
        h = self.advance(features, tokens)
        stable, k, dev = self.cache.length, tree.top_k, tokens.device
        pool = DraftPool()

        scores1, tok1 = self.top_tokens(h[None], k)
        scores1, tok1 = scores1[0], tok1[0]
        k = tok1.numel()
        idx1 = pool.add(tok1, torch.full((k,), -1, device=dev), scores1, "serial-1", 1)
        if depth == 0:
            return pool

        u1 = self.transformer.fuse(self.embed(tok1), h.expand(k, -1))
        if tree.serial_tree_mask:
            own = torch.eye(k, dtype=torch.bool, device=dev)
        else:  # the official code's causal mask among the k serial-1 nodes (docs/design.md §10.2)
            own = torch.ones(k, k, dtype=torch.bool, device=dev).tril()
        h1 = self.expand(u1, stable, stable, own)
        scores2, tok2 = self.top_tokens(h1, k)
        cumulative = (scores1[:, None] + scores2).flatten()
        best = torch.topk(cumulative, k).indices
        rows = best // k
        tok2, scores2 = tok2.flatten()[best], cumulative[best]
        idx2 = pool.add(tok2, idx1[rows], scores2, "serial-2", 2)
        heads_used = depth - 1
        if heads_used == 0:
            return pool

        # The official code pairs serial-2 node r with serial-1 node r instead of its parent (docs/design.md §10.1).
        first = u1[rows] if tree.mlp_parent_align else u1
        second = self.transformer.fuse(self.embed(tok2), h1[rows])
        predicted = self.heads(torch.cat([first, second], -1), heads_used)  # [heads_used, k, H]
        head_scores, head_ids = self.top_tokens(predicted, tree.mlptopk)  # [heads, k, mlptopk]
        mlptopk = head_ids.shape[-1]

        branch_idx, branch_row, branch_score = idx2, torch.arange(k, device=dev), scores2
        for m in range(heads_used):
            candidates = (branch_score[:, None] + head_scores[m, branch_row]).flatten()
            keep = torch.topk(candidates, min(tree.pruning, candidates.numel())).indices
            parent = keep // mlptopk
            row = branch_row[parent]
            new_tokens = head_ids[m, row, keep % mlptopk]
            branch_idx = pool.add(new_tokens, branch_idx[parent], candidates[keep], f"mlp-{m + 3}", m + 3)
            branch_row, branch_score = row, candidates[keep]
        return pool
