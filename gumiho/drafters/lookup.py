"""Prompt lookup decoding: draft what followed earlier occurrences of the text's last few tokens (no weights).

Each cycle the drafter looks for the sequence's last n tokens (prompt and output so far, the root included) earlier
in the sequence, for n from `tree.max_ngram` down to `tree.min_ngram`, and drafts the tokens that followed each
occurrence. Up to `tree.top_k` occurrences are used, the longest matches first and, among equally long ones, the
most recent first; their continuations (up to `tree.depth` tokens each) are merged into a trie, so occurrences
that agree share nodes and occurrences that disagree become branches. docs/design.md §17.

Scores are pseudo log-probabilities. An occurrence matching n tokens weighs (top_k + 1)^n, so one longer match
outweighs every shorter one together. A node's score is log(weight of the occurrences through it / weight of all)
+ depth * log(continues(L)), L the longest match through the node: a longer match is taken as likelier to go on
(a one-token match is a weak hint, a three-token one a good one), and per-cycle sizing (sizing.py) calibrates
these numbers against what the target accepts. A child's occurrences are a subset of its parent's, so its L is no
longer and its score is always below its parent's: `tree.build_tree`'s rerank keeps a tree.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch

from ..tree import DraftPool, TreeSettings
from .base import WeightFreeDrafter

SOURCE = "lookup"


def continues(length: int) -> float:
    """The prior chance that a continuation goes on one more token after a match of `length` tokens."""
    return length / (length + 1.5)


@dataclass(frozen=True)
class Match:
    """An earlier occurrence of the sequence's last `length` tokens, ending at index `end` (so its continuation
    starts at end + 1)."""

    end: int
    length: int


def find_matches(sequence: np.ndarray, max_ngram: int, min_ngram: int, limit: int) -> list[Match]:
    """The earlier occurrences of the sequence's suffix of `min_ngram` tokens or more (each counted once, with its
    longest match up to `max_ngram`), longest first, then most recent first; at most `limit`. An occurrence must
    end before the last token, so at least one token follows it."""
    n = len(sequence)
    if n < 2 or limit < 1:
        return []
    ends = np.arange(n - 1)  # where an earlier occurrence may end
    running = np.ones(n - 1, dtype=bool)  # still matching at offset i
    length = np.zeros(n - 1, dtype=np.int64)
    for i in range(min(max_ngram, n - 1)):
        at = ends - i
        running &= (at >= 0) & (sequence[np.maximum(at, 0)] == sequence[n - 1 - i])
        if not running.any():
            break
        length += running
    found = np.flatnonzero(length >= min_ngram)
    if found.size == 0:
        return []
    order = np.lexsort((-found, -length[found]))[:limit]  # the last key sorts first: length, then recency
    return [Match(int(found[i]), int(length[found[i]])) for i in order]


@dataclass
class _Node:
    token: int
    parent: int  # trie node id, -1 under the root
    depth: int
    log_weights: list[float] = field(default_factory=list)
    longest: int = 0  # the longest match through this node


def lookup_pool(sequence: np.ndarray, tree: TreeSettings, device: torch.device | None = None) -> DraftPool:
    """The candidate pool for `sequence` (its last token is the root): the trie of the continuations of
    `find_matches`, depth by depth, siblings best first. Empty when nothing matches."""
    pool = DraftPool()
    matches = find_matches(sequence, tree.max_ngram, tree.min_ngram, tree.top_k)
    if not matches:
        return pool
    base = math.log(tree.top_k + 1)
    nodes: list[_Node] = []
    children: dict[tuple[int, int], int] = {}
    for match in matches:
        log_weight = match.length * base
        parent = -1
        for depth, token in enumerate(sequence[match.end + 1 : match.end + 1 + tree.depth].tolist(), start=1):
            node = children.get((parent, token))
            if node is None:
                node = children[(parent, token)] = len(nodes)
                nodes.append(_Node(token, parent, depth))
            nodes[node].log_weights.append(log_weight)
            nodes[node].longest = max(nodes[node].longest, match.length)
            parent = node
    total = _logsumexp([m.length * base for m in matches])
    scores = [_logsumexp(n.log_weights) - total + n.depth * math.log(continues(n.longest)) for n in nodes]
    position = {}  # trie node -> pool index
    for depth in range(1, tree.depth + 1):
        layer = [i for i, n in enumerate(nodes) if n.depth == depth]  # in trie order: the earlier match first
        if not layer:
            break
        layer.sort(key=lambda i: -scores[i])  # stable: equal scores keep the earlier match's branch first
        indices = pool.add(
            torch.tensor([nodes[i].token for i in layer], device=device),
            torch.tensor([position[nodes[i].parent] if nodes[i].parent >= 0 else -1 for i in layer], device=device),
            torch.tensor([scores[i] for i in layer], device=device),
            SOURCE, depth,
        )
        position.update(zip(layer, indices.tolist()))
    return pool


def _logsumexp(values: list[float]) -> float:
    top = max(values)
    return top + math.log(sum(math.exp(v - top) for v in values))


class LookupDrafter(WeightFreeDrafter):
    """Prompt lookup over the whole sequence so far. The engine's `observe` of the prefill gives the prompt (its
    first token included); each `propose` appends the newly accepted tokens, the new root last."""

    kind = "lookup"

    def __init__(self, config):
        super().__init__(config)
        self.reset()

    def reset(self) -> None:
        self._sequence = np.empty(1024, dtype=np.int64)
        self._length = 0
        self._first = 0  # the sequence index of _sequence[0]: 1 when the prompt's first token was never seen
        self._pairs = 0  # pairs received by propose: their tokens are the sequence's tokens 1 .. _pairs

    @property
    def sequence(self) -> np.ndarray:
        """The tokens seen so far, in order (a view; the last one is the current root)."""
        return self._sequence[: self._length]

    def observe(self, tokens: torch.Tensor, features: torch.Tensor, logits: torch.Tensor | None = None,
                parents: list[int] | None = None) -> None:
        if parents is None and self._length == 0 and self._pairs == 0:  # the prefill: the prompt
            self._append(tokens.tolist())

    def draft(self, features: torch.Tensor, tokens: torch.Tensor, tree: TreeSettings) -> DraftPool:
        if self._length == 0 and self._pairs == 0:
            self._first = 1  # no prompt was observed: the sequence starts at the first pair's token
        start = self._pairs + 1  # the sequence index of tokens[0]
        skip = max(0, self._first + self._length - start)  # tokens the prefill already gave
        self._append(tokens[skip:].tolist())
        self._pairs += tokens.shape[0]
        return lookup_pool(self.sequence, tree, tokens.device)

    def _append(self, tokens: list[int]) -> None:
        end = self._length + len(tokens)
        if end > len(self._sequence):
            grown = np.empty(max(end, 2 * len(self._sequence)), dtype=np.int64)
            grown[: self._length] = self._sequence[: self._length]
            self._sequence = grown
        self._sequence[self._length : end] = tokens
        self._length = end
