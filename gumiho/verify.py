"""Accept the longest draft prefix the target agrees with, plus one bonus token from the target.

Greedy (T = 0): a path's draft token is accepted while it equals the target's argmax at its parent; the best path
is the first one reaching the maximum, and the bonus token is the target's argmax after its last accepted node.

Sampling (T > 0): recursive rejection over the tree's distinct children with a deterministic (point-mass) draft.
At the current node with target distribution p, child x is accepted with probability p(x); on rejection p(x) is
set to 0 and p renormalised before the next child is tried. When every child is rejected, the bonus token is drawn
from that residual; when the walk reaches a leaf, from p at the leaf. Each emitted token is distributed exactly as
the target's (processed) distribution, so the method is lossless. The walk keeps what it already computed for the
trace: p of every child of a node it visited, and each test's threshold and uniform draw.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from .sampling import SamplingConfig, greedy_token, probabilities, sample
from .tree import DraftTree


PREFETCH_ROWS = 4  # the most rows an acceptance walk computes in one head product (`LazyLogits.together`)
# A tree of this many rows or fewer has all of them computed in that product, siblings included: a third row adds
# about 0.1 ms to the 8-bit head's product on a 2-core Zen 5 EPYC, where a row of its own costs 0.35-0.6 ms.
ALL_ROWS = 3


class LazyLogits:
    """The target's logits over a verified tree, one row computed when first read.

    A greedy walk reads only the rows of the accepted path and the node after it (tau rows, not the tree's n), and
    the lm_head of a small model is a large share of a verification on a CPU. Each row is its own one-row product,
    exactly as in an AR step, so the walk decides every token as AR would. `together`: the head computes a row the
    same way in a product of several, and such a product costs little more than one row (int4.Q8Matrix); the
    walk then reads the draft's likeliest path in one product (`prefetch`). `full()` gives every row at once (for
    what needs them all: FTA's paths, MJSD's joint test, Token Recycling's table)."""

    def __init__(self, features: torch.Tensor, head: Callable[[torch.Tensor], torch.Tensor], together: bool = False):
        self.features, self.head, self.together = features, head, together
        self.rows: dict[int, torch.Tensor] = {}
        self._full: torch.Tensor | None = None

    def __len__(self) -> int:
        return self.features.shape[0]

    def __getitem__(self, node: int) -> torch.Tensor:
        if self._full is not None:
            return self._full[node]
        if node not in self.rows:
            self.rows[node] = self.head(self.features[node : node + 1])[0]
        return self.rows[node]

    def prefetch(self, nodes: list[int]) -> None:
        """Compute the rows of `nodes` not computed yet, in one product."""
        missing = [node for node in nodes if node not in self.rows] if self._full is None else []
        if missing:
            for node, row in zip(missing, self.head(self.features[missing])):
                self.rows[node] = row

    def full(self) -> torch.Tensor:
        if self._full is None:
            self._full = self.head(self.features)
        return self._full

    def computed(self) -> tuple[list[int], torch.Tensor]:
        """The rows computed so far (node indices, ascending) and their logits [k, V]: what is free to read."""
        if self._full is not None:
            return list(range(len(self))), self._full
        nodes = sorted(self.rows)
        if len(nodes) == 1:  # a plain step's one row: a view, not a copy
            return nodes, self.rows[nodes[0]][None]
        return nodes, torch.stack([self.rows[n] for n in nodes])


@dataclass
class Acceptance:
    nodes: list[int]  # accepted path, root first
    bonus: int  # token id the target adds after the path
    path_row: int  # the row of tree.paths that the accepted path follows
    per_path: list[int]  # draft tokens accepted along each path row
    # What the rule computed anyway, kept for the trace (node_probs.py); tensors stay tensors until it is recorded.
    probs: dict[int, torch.Tensor] = field(default_factory=dict)  # node -> p of its children's tokens, in child order
    tests: dict[int, tuple[float, float]] = field(default_factory=dict)  # sampled: child -> (threshold, draw)


def _per_path(tree: DraftTree, nodes: list[int]) -> list[int]:
    paths = tree.paths.tolist()
    counts = []
    for row in paths:
        k = 0
        while k + 1 < len(nodes) and k + 1 < len(row) and row[k + 1] == nodes[k + 1]:
            k += 1
        counts.append(k)
    return counts


def _prefetch_likeliest(tree: DraftTree, children: list[list[int]], logits: LazyLogits | torch.Tensor) -> None:
    """Where the head computes rows together, the root and the draft's likeliest path below it (the best-scored
    child at each depth) in one product: the rows a walk most likely reads. A tree of ALL_ROWS rows or fewer, every
    row."""
    if isinstance(logits, LazyLogits) and logits.together:
        if tree.size <= ALL_ROWS:
            logits.prefetch(list(range(tree.size)))
            return
        likeliest = [0]
        while children[likeliest[-1]] and len(likeliest) < PREFETCH_ROWS:
            likeliest.append(max(children[likeliest[-1]], key=lambda c: tree.scores[c]))
        logits.prefetch(likeliest)


def walk_greedy(tree: DraftTree, logits: LazyLogits) -> Acceptance:
    """From the root, follow the child whose token is the target's argmax until none is: the same path and bonus
    as `verify_greedy` on a tree whose siblings are distinct tokens (every drafter's), reading only that path's
    rows."""
    children, tokens = tree.children(), tree.tokens.tolist()
    _prefetch_likeliest(tree, children, logits)
    node, nodes = 0, [0]
    while True:
        predicted = greedy_token(logits[node])
        node = next((c for c in children[node] if tokens[c] == predicted), -1)
        if node < 0:
            break
        nodes.append(node)
    per_path = _per_path(tree, nodes)
    row = next(r for r, k in enumerate(per_path) if k == len(nodes) - 1)
    return Acceptance(nodes=nodes, bonus=predicted, path_row=row, per_path=per_path)


def verify_greedy(tree: DraftTree, logits: torch.Tensor) -> Acceptance:
    """logits: [N, V], one row per tree node."""
    predicted = logits.argmax(-1)
    paths = tree.paths
    valid = paths >= 0
    safe = paths.clamp(min=0)
    candidates = torch.where(valid, tree.tokens[safe], -1)
    match = candidates[:, 1:] == predicted[safe[:, :-1]]
    accepted = match.long().cumprod(1).sum(1)
    row = int(accepted.argmax())  # first row reaching the maximum
    length = int(accepted[row])
    nodes = paths[row, : length + 1].tolist()
    return Acceptance(nodes=nodes, bonus=int(predicted[nodes[-1]]), path_row=row, per_path=accepted.tolist())


def verify_sampling(
    tree: DraftTree, logits: torch.Tensor | LazyLogits, cfg: SamplingConfig, generator: torch.Generator
) -> Acceptance:
    children = tree.children()
    tokens = tree.tokens.tolist()
    _prefetch_likeliest(tree, children, logits)
    node, nodes = 0, [0]
    probs: dict[int, torch.Tensor] = {}
    tests: dict[int, tuple[float, float]] = {}
    while True:
        p = probabilities(logits[node], cfg)
        if children[node]:
            probs[node] = p[[tokens[c] for c in children[node]]]  # a copy, before the residual changes p
        next_node = None
        for child in children[node]:
            x = tokens[child]
            threshold, draw = float(p[x]), float(torch.rand((), generator=generator))
            tests[child] = (threshold, draw)
            if draw < threshold:
                next_node = child
                break
            p[x] = 0.0
            total = p.sum()
            if total <= 0:  # only through rounding: the rejected tokens held all the mass
                p = probabilities(logits[node], cfg)
                break
            p /= total
        if next_node is None:
            bonus = sample(p, generator)
            break
        nodes.append(next_node)
        node = next_node
        if not children[node]:
            bonus = sample(probabilities(logits[node], cfg), generator)
            break
    per_path = _per_path(tree, nodes)
    row = next(r for r, k in enumerate(per_path) if k == len(nodes) - 1)
    return Acceptance(nodes=nodes, bonus=bonus, path_row=row, per_path=per_path, probs=probs, tests=tests)


def verify(tree: DraftTree, logits: torch.Tensor | LazyLogits, cfg: SamplingConfig,
           generator: torch.Generator) -> Acceptance:
    """Lazy logits are read row by row where the rule allows it: the greedy walk (FTA's borrowed paths need every
    row) and the sampling walk, which reads the nodes it visits only."""
    if cfg.greedy:
        if isinstance(logits, LazyLogits):
            return verify_greedy(tree, logits.full()) if bool(tree.filled.any()) else walk_greedy(tree, logits)
        return verify_greedy(tree, logits)
    return verify_sampling(tree, logits, cfg, generator)
