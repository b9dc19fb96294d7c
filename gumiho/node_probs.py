"""Why each draft token passed or failed: the draft's and the target's probability of every node's token, for the
trace (TraceNode q, p, accept, draw; trace.py describes them).

Only what decoding computed anyway is read, once a cycle is recorded: q from the tree's scores (cumulative draft
log-probs), p from the verification rows the target's head computed (`LazyLogits.computed`) or those the acceptance
rule kept (`Acceptance.probs`), the thresholds and draws from the sampled walk (`Acceptance.tests`). A row the rule
never read leaves its children's p unknown (None) rather than cost another head row.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .sampling import SamplingConfig, probabilities
from .tree import DraftTree
from .verify import Acceptance, LazyLogits

NOT_PROBABILITIES = frozenset({"lookup"})  # sources whose scores are not log-probs: prompt lookup's pseudo log-prob


@dataclass
class NodeChecks:
    """One value per tree node (None for the root and where unknown)."""

    q: list[float | None]
    p: list[float | None]
    accept: list[float | None]
    draw: list[float | None]

    @classmethod
    def of(cls, tree: DraftTree, logits: LazyLogits, acceptance: Acceptance, sampling: SamplingConfig) -> NodeChecks:
        tests = [acceptance.tests.get(node, (None, None)) for node in range(tree.size)]
        return cls(q=draft_probs(tree), p=target_probs(tree, logits, acceptance, sampling),
                   accept=[threshold for threshold, _ in tests], draw=[draw for _, draw in tests])


def draft_probs(tree: DraftTree) -> list[float | None]:
    """q: the drafter's probability of each node's token at its parent, exp(score - parent's score)."""
    return [None if parent < 0 or source in NOT_PROBABILITIES else math.exp(score - tree.scores[parent])
            for parent, score, source in zip(tree.parents, tree.scores, tree.sources)]


def target_probs(tree: DraftTree, logits: LazyLogits, acceptance: Acceptance,
                 sampling: SamplingConfig) -> list[float | None]:
    """p: the target's probability of each node's token at its parent, under the distribution the rule tests
    (the plain softmax when greedy, the run's sampling distribution otherwise), for the parents whose rows exist."""
    children = tree.children()
    known = dict(acceptance.probs)
    rows, values = logits.computed()
    missing = [i for i, row in enumerate(rows) if row not in known and children[row]]
    if missing:
        picked = values[missing].float()
        dists = torch.softmax(picked, -1) if sampling.greedy else probabilities(picked, sampling)
        tokens = tree.tokens.to(dists.device)
        for i, dist in zip(missing, dists):
            known[rows[i]] = dist[tokens[children[rows[i]]]]
    p: list[float | None] = [None] * tree.size
    for parent, probs in known.items():
        for child, value in zip(children[parent], probs.tolist()):
            p[child] = value
    return p
