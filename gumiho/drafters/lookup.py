"""Prompt lookup decoding: draft what followed earlier occurrences of the text's last few tokens (no weights).

Each cycle the drafter looks for the sequence's last n tokens (prompt and output so far, the root included) earlier
in the sequence, for n from `tree.max_ngram` down to `tree.min_ngram`, and drafts the tokens that followed each
occurrence. Up to `tree.top_k` occurrences are used, the longest matches first and, among equally long ones, the
most recent first; their continuations (up to `tree.depth` tokens each) are merged into a trie, so occurrences
that agree share nodes and occurrences that disagree become branches. docs/design.md §17.

Scores are pseudo log-probabilities. An occurrence matching n tokens weighs (top_k + 1)^n, so one longer match
outweighs every shorter one together. A node's score is log(weight of the occurrences through it / weight of all)
+ log(continues(L) x continues(L + 1) x ... over its depth), L the longest match through the node: a longer match
is likelier to go on (a one-token match is a weak hint, a three-token one a good one), and each right token
lengthens it. Per-cycle sizing (sizing.py) starts from these numbers and calibrates them against what the target
accepts. A child's occurrences are a subset of its parent's, so its L is no
longer and its score is always below its parent's: `tree.build_tree`'s rerank keeps a tree.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache

import numpy as np
import torch

from ..tree import DraftPool, TreeSettings
from .base import WeightFreeDrafter

SOURCE = "lookup"


def continues(length: int) -> float:
    """The prior chance that the token after a match of `length` tokens is the one that followed it before: n^2 /
    (n^2 + 4). Fitted to SmolLM2-135M's greedy replies to the calibration prompts (data/calibration, none from the
    benchmark sets; the best match's next token right 20% / 50% / 83% of the time after 1 / 2 / 3 tokens, and, once
    right, the token after it 54% / 61% / 87%, as a match one token longer)."""
    return length * length / (length * length + 4.0)


@cache
def chance_through(length: int, depth: int) -> float:
    """log of the prior chance that a continuation is right for `depth` tokens after a match of `length`: each right
    token lengthens the match by one."""
    return sum(math.log(continues(length + step)) for step in range(depth))


@dataclass(frozen=True)
class Match:
    """An earlier occurrence of the sequence's last `length` tokens, ending at index `end` (so its continuation
    starts at end + 1)."""

    end: int
    length: int


def find_matches(sequence: np.ndarray, max_ngram: int, min_ngram: int, limit: int,
                 ends: np.ndarray | None = None) -> list[Match]:
    """The earlier occurrences of the sequence's suffix of `min_ngram` tokens or more (each counted once, with its
    longest match up to `max_ngram`), longest first, then most recent first; at most `limit`. An occurrence must
    end before the last token, so at least one token follows it. `ends`: the positions where one may end, where
    the caller knows them (those of the last token before it, from an index); every position by default."""
    n = len(sequence)
    if n < 2 or limit < 1:
        return []
    ends = np.arange(n - 1) if ends is None else ends
    running = np.ones(len(ends), dtype=bool)  # still matching at offset i
    length = np.zeros(len(ends), dtype=np.int64)
    for i in range(min(max_ngram, n - 1)):
        at = ends - i
        running &= (at >= 0) & (sequence[np.maximum(at, 0)] == sequence[n - 1 - i])
        if not running.any():
            break
        length += running
    found = np.flatnonzero(length >= min_ngram)
    if found.size == 0:
        return []
    positions, lengths = ends[found], length[found]
    order = np.lexsort((-positions, -lengths))[:limit]  # the last key sorts first: length, then recency
    return [Match(int(positions[i]), int(lengths[i])) for i in order]


def lookup_pool(sequence: np.ndarray, tree: TreeSettings, device: torch.device | None = None,
                ends: np.ndarray | None = None) -> DraftPool:
    """The candidate pool for `sequence` (its last token is the root): the trie of the continuations of
    `find_matches` (`ends` as there), depth by depth, siblings best first. Empty when nothing matches."""
    pool = DraftPool()
    matches = find_matches(sequence, tree.max_ngram, tree.min_ngram, tree.top_k, ends)
    if not matches:
        return pool
    # Trie nodes as parallel lists: token, parent node (-1 under the root), depth, weight, longest match through it.
    # An occurrence matching n tokens weighs (top_k + 1) ** n: small integers, summed exactly in floats.
    tokens: list[int] = []
    parents: list[int] = []
    depths: list[int] = []
    weights: list[float] = []
    longest: list[int] = []
    children: dict[tuple[int, int], int] = {}
    match_weights = [float((tree.top_k + 1) ** match.length) for match in matches]
    for match, weight in zip(matches, match_weights):
        parent = -1
        for depth, token in enumerate(sequence[match.end + 1 : match.end + 1 + tree.depth].tolist(), start=1):
            node = children.get((parent, token))
            if node is None:
                node = children[(parent, token)] = len(tokens)
                tokens.append(token)
                parents.append(parent)
                depths.append(depth)
                weights.append(0.0)
                longest.append(0)
            weights[node] += weight
            longest[node] = max(longest[node], match.length)
            parent = node
    total = sum(match_weights)
    scores = [math.log(w / total) + chance_through(m, d) for w, d, m in zip(weights, depths, longest)]
    # Depth by depth, siblings best first (stable: equal scores keep the earlier match's branch first).
    order = sorted(range(len(tokens)), key=lambda i: (depths[i], -scores[i]))
    position = {node: i for i, node in enumerate(order)}  # trie node -> pool index
    pool.add(torch.tensor([tokens[i] for i in order], device=device),
             torch.tensor([position[parents[i]] if parents[i] >= 0 else -1 for i in order], device=device),
             torch.tensor([scores[i] for i in order], device=device), SOURCE, [depths[i] for i in order])
    return pool


class LookupDrafter(WeightFreeDrafter):
    """Prompt lookup over the whole sequence so far. The engine's `observe` of the prefill gives the prompt (its
    first token included); each `propose` appends the newly accepted tokens, the new root last."""

    kind = "lookup"

    def __init__(self, config):
        super().__init__(config)
        self.reset()

    def reset(self) -> None:
        self._sequence = np.empty(1024, dtype=np.int64)
        self._where: dict[int, list[int]] = {}  # token -> its positions in the sequence: where a match may end
        # The last three tokens -> the positions where those three end: where a match of three or more may end. A
        # learned drafter's switch (tree.lookup_merge) asks every cycle and is mostly told "nowhere" at once.
        self._where3: dict[tuple[int, int, int], list[int]] = {}
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
        self.extend(tokens)
        return self.candidates(tree, tokens.device)

    def extend(self, tokens: torch.Tensor) -> None:
        """Take the newly accepted pairs' tokens (the new root last); those the prefill already gave are skipped."""
        if self._length == 0 and self._pairs == 0:
            self._first = 1  # no prompt was observed: the sequence starts at the first pair's token
        start = self._pairs + 1  # the sequence index of tokens[0]
        skip = max(0, self._first + self._length - start)  # tokens the prefill already gave
        self._append(tokens[skip:].tolist())
        self._pairs += tokens.shape[0]

    def candidates(self, tree: TreeSettings, device: torch.device | None = None) -> DraftPool:
        """The pool for the sequence so far (its last token the root), matching `tree.min_ngram` tokens or more.
        A learned drafter's run asks twice in some cycles (its switch, then its branches), after one `extend`."""
        if tree.min_ngram >= 3 and self._length >= 3:
            earlier = self._where3[tuple(self._sequence[self._length - 3 : self._length].tolist())][:-1]
        else:
            earlier = self._where[int(self._sequence[self._length - 1])][:-1] if self._length else []
        if not earlier:  # the root's own position left out above
            return DraftPool()
        return lookup_pool(self.sequence, tree, device, np.array(earlier))

    def _append(self, tokens: list[int]) -> None:
        end = self._length + len(tokens)
        if end > len(self._sequence):
            grown = np.empty(max(end, 2 * len(self._sequence)), dtype=np.int64)
            grown[: self._length] = self._sequence[: self._length]
            self._sequence = grown
        self._sequence[self._length : end] = tokens
        last = self._sequence[max(0, self._length - 2) : self._length].tolist()
        for position, token in enumerate(tokens, start=self._length):
            self._where.setdefault(token, []).append(position)
            last.append(token)
            if len(last) >= 3:
                self._where3.setdefault((last[-3], last[-2], last[-1]), []).append(position)
        self._length = end
