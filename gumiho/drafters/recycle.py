"""Token Recycling (arXiv 2408.08696): draft from the target's own earlier predictions, kept in a table (no weights).

The table maps each token to the TABLE_WIDTH tokens the target ranked highest after it, with their log-probs, the
last time the target ran on that token: after the prefill from the prompt's rows (its last PROMPT_ROWS
positions), and after every verification from the nodes whose lm_head rows the verification computed (the
accepted path and the node after it; computing every node's row, as the paper does on a GPU, costs an lm_head row
each on a CPU). A token whose row was written twice keeps the later write; within one forward, the later node.

Drafting is a beam through the table, as EAGLE-2 grows its tree (docs/design.md §3.1, §17): the root's `top_k`
table entries form depth 1; at each further depth the `top_k` best open nodes by cumulative log-prob each get their
`top_k` entries, up to `tree.depth` tokens deep. A token never seen has no row and no children; with an empty root
row the pool is empty and the cycle is a plain decoding step. A node's score is the log of its prior chance of being
accepted: per edge, `right(p)` of the recorded probability p, summed along the path, so a child never scores above
its parent; per-cycle sizing (sizing.py) starts from these numbers and calibrates them against what the target
accepts.

Memory: two dense [vocab, TABLE_WIDTH] tensors (int32 ids, fp32 log-probs): 6.3 MB for a 49,152-token vocabulary.
The table starts empty for every generation, so a run is reproducible and never shows another prompt's tokens;
`hot_start=True` keeps it from one generation to the next, as the paper does.
"""

from __future__ import annotations

import math

import torch

from ..errors import GumihoError
from ..tree import RECYCLE_WIDTH, DraftPool, TreeSettings
from ..verify import LazyLogits
from .base import WeightFreeDrafter, top_logprobs

TABLE_WIDTH = RECYCLE_WIDTH  # next tokens kept per token: the widest top_k a recycle tree may use
PROMPT_ROWS = 512  # prompt positions whose logits fill the table after the prefill (the last ones)
CHUNK = 128  # prompt rows per lm_head call
SOURCE = "recycle"
# A table entry recorded with probability p is the target's next token about RIGHT * p ** SHARPNESS of the time:
# SmolLM2-135M's greedy replies to 30 calibration prompts (data/calibration, none from the benchmark sets; 3,422
# first-level nodes of 16-token trees), accepted 6% / 11% / 28% / 34% / 50% of the time at p 0.05 / 0.15 / 0.45 /
# 0.75 / 0.95. The table was written in another context, so the target's confidence then overstates its chance now.
RIGHT, SHARPNESS = 0.5, 0.8


def right(logp: float) -> float:
    """log of the prior chance that a table entry of log-probability `logp` is the target's next token."""
    return math.log(RIGHT) + SHARPNESS * logp


def last_positions(tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The distinct tokens of `tokens` [n] and the position of each one's last occurrence; None where every token is
    distinct (each row is its own token's). In Python: a cycle's few tokens would cost four tensor operations."""
    last = {token: i for i, token in enumerate(tokens.tolist())}  # a later occurrence overwrites an earlier one
    if len(last) == tokens.shape[0]:
        return None
    return (torch.tensor(list(last), device=tokens.device),
            torch.tensor(list(last.values()), device=tokens.device))


class RecycleDrafter(WeightFreeDrafter):
    kind = "recycle"
    # The prefill puts up to PROMPT_ROWS prompt rows through the lm_head: oneDNN-packed where it can (128 rows:
    # 15.7 ms against 48 plain on a 2-core Zen 5 EPYC; recycling 0.95x -> 1.02x AR on 18 prompts, CNN/DM 0.84x ->
    # 0.93x), fp32 either way; or, where the target's prompts take bf16 products on AMX tiles, a tile copy of the head
    # (`prompt_head`: its rows rounded to bf16, as the table's later rows from the 8-bit head are rounded too).
    pack_head = True

    def __init__(self, config, hot_start: bool = False):
        super().__init__(config)
        self.hot_start = hot_start
        self.width = min(TABLE_WIDTH, config.vocab_size)
        self.next_ids: torch.Tensor | None = None  # [vocab, width] int32, -1 where the token was never seen
        self.next_logp: torch.Tensor | None = None  # [vocab, width] fp32, the target's log-probs of next_ids

    # --- the table ------------------------------------------------------------------------------------------------
    @torch.inference_mode()
    def reset(self) -> None:
        if self.next_ids is not None and not self.hot_start:
            self.next_ids.fill_(-1)
            self.next_logp.fill_(float("-inf"))

    def _table(self, device: torch.device) -> None:
        if self.next_ids is None or self.next_ids.device != device:
            vocab = self.config.vocab_size
            self.next_ids = torch.full((vocab, self.width), -1, dtype=torch.int32, device=device)
            self.next_logp = torch.full((vocab, self.width), float("-inf"), dtype=torch.float32, device=device)

    def observe(self, tokens: torch.Tensor, features: torch.Tensor, logits: LazyLogits | torch.Tensor | None = None,
                parents: list[int] | None = None) -> None:
        if logits is None:  # the prefill: the lm_head over the prompt's last rows, a chunk at a time
            tokens, features = tokens[-PROMPT_ROWS:], features[-PROMPT_ROWS:]
            if (distinct := last_positions(tokens)) is not None:  # a token's earlier rows would be overwritten
                tokens, features = tokens[distinct[1]], features[distinct[1]]
            head = self.prompt_head or self.head_logits
            for start in range(0, tokens.shape[0], CHUNK):
                self.record(tokens[start:start + CHUNK], head(features[start:start + CHUNK]))
        elif isinstance(logits, LazyLogits):  # a verification: the rows its acceptance walk computed (free)
            nodes, rows = logits.computed()
            self.record(tokens[nodes], rows)
        else:
            self.record(tokens, logits)

    @torch.inference_mode()
    def record(self, tokens: torch.Tensor, logits: torch.Tensor) -> None:
        """Write the row of each of `tokens` [n] from the target's `logits` [n, vocab] after it; of repeated
        tokens, the last one's row is kept."""
        self._table(tokens.device)
        logp, ids = top_logprobs(logits, self.width)
        if (distinct := last_positions(tokens)) is not None:
            tokens, ids, logp = distinct[0], ids[distinct[1]], logp[distinct[1]]
        self.next_ids[tokens] = ids.to(torch.int32)
        self.next_logp[tokens] = logp.clamp(max=0.0)

    # --- drafting -------------------------------------------------------------------------------------------------
    def check_tree(self, tree: TreeSettings) -> None:
        if tree.top_k > self.width:
            raise GumihoError(f"recycle's table keeps {self.width} next tokens per token: top-k must be at most "
                              f"{self.width}, got {tree.top_k}")

    def first_score(self, root: int) -> float | None:
        """The root's best table entry, scored as `draft` scores it (its table row is sorted best first)."""
        if self.next_ids is None or int(self.next_ids[root, 0]) < 0:
            return float("-inf")
        return right(float(self.next_logp[root, 0]))

    def draft(self, features: torch.Tensor, tokens: torch.Tensor, tree: TreeSettings) -> DraftPool:
        """The beam in Python lists, two table reads a level: a CPU tree has a few dozen nodes, and a dozen small
        tensor operations a level cost more than the work (0.39 ms a cycle in the engine on a 2-core Zen 5)."""
        pool = DraftPool()
        if self.next_ids is None:
            return pool
        k, device = min(tree.top_k, self.width), tokens.device
        open_nodes = [(int(tokens[-1]), 0.0, -1)]  # (token, score, pool index) of the nodes to expand: the root
        ids: list[int] = []
        parents: list[int] = []
        scores: list[float] = []
        depths: list[int] = []
        for depth in range(1, tree.depth + 1):
            rows = torch.tensor([token for token, _, _ in open_nodes], device=self.next_ids.device)
            children = [(child, score + right(logp), at)
                        for (_, score, at), row_ids, row_logp in zip(open_nodes, self.next_ids[rows, :k].tolist(),
                                                                     self.next_logp[rows, :k].tolist())
                        for child, logp in zip(row_ids, row_logp) if child >= 0]
            if not children:
                break
            first = len(ids)
            for child, score, at in children:
                ids.append(child)
                parents.append(at)
                scores.append(score)
                depths.append(depth)
            if depth == tree.depth:
                break
            best = sorted(range(len(children)), key=lambda i: -children[i][1])[:k]  # stable: ties to the earlier
            open_nodes = [(children[i][0], children[i][1], first + i) for i in best]
        if ids:
            pool.add(torch.tensor(ids, device=device), torch.tensor(parents, device=device),
                     torch.tensor(scores, device=device), SOURCE, depths)
        return pool
