"""EAGLE-2: a 1-layer feature-level draft grown into a dynamic tree.

Layer 1 is the top-k of the draft's prediction at the root. Each of `depth` expansion steps (fewer when the tree is
too small to keep their nodes: `TreeSettings.drafted_depth`) feeds the k open nodes at one position (each sees its
own ancestors), scores their k x k children by cumulative log-prob, puts all k^2 children in the pool and keeps the
best k open. The rerank to `total_tokens` happens in `tree.build_tree`.
"""

from __future__ import annotations

import torch

from ..tree import DraftPool, TreeSettings
from .base import FeatureDrafter


class Eagle2Drafter(FeatureDrafter):
    kind = "eagle2"

    def draft(self, features: torch.Tensor, tokens: torch.Tensor, tree: TreeSettings) -> DraftPool:
        h = self.advance(features, tokens)
        stable, k, dev = self.cache.length, tree.top_k, tokens.device
        pool = DraftPool()
        scores, ids = self.top_tokens(h[None], k)
        open_score, open_tok = scores[0], ids[0]
        k = open_tok.numel()
        open_idx = pool.add(open_tok, torch.full((k,), -1, device=dev), open_score, "eagle-1", 1)
        open_feat = h.expand(k, -1)
        seen = torch.zeros(k, 0, dtype=torch.bool, device=dev)  # each open node's ancestors among expansion slots
        eye = torch.eye(k, dtype=torch.bool, device=dev)
        depth = tree.drafted_depth
        for step in range(1, depth + 1):
            fused = self.transformer.fuse(self.embed(open_tok), open_feat)
            out = self.expand(fused, stable + step - 1, stable, torch.cat([seen, eye], 1))
            child_scores, child_ids = self.top_tokens(out, k)
            cumulative = (open_score[:, None] + child_scores).flatten()
            child_idx = pool.add(child_ids.flatten(), open_idx.repeat_interleave(k), cumulative, f"eagle-{step + 1}", step + 1)
            if step == depth:
                break
            best = torch.topk(cumulative, k).indices
            rows = best // k
            seen = torch.cat([seen[rows], eye[rows]], 1)
            open_score, open_tok, open_idx, open_feat = cumulative[best], child_ids.flatten()[best], child_idx[best], out[rows]
        return pool
