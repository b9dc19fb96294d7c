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
from collections.abc import Iterable, Sequence
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


def find_matches(sequence: Sequence[int], max_ngram: int, min_ngram: int, limit: int,
                 ends: Iterable[int] | None = None) -> list[Match]:
    """The earlier occurrences of the sequence's suffix of `min_ngram` tokens or more (each counted once, with its
    longest match up to `max_ngram`), longest first, then most recent first; at most `limit`. An occurrence must
    end before the last token, so at least one token follows it. `ends`: the positions where one may end, where
    the caller knows them (those of the last token before it, from an index); every position by default.

    Plain Python over the candidate ends: a cycle has a few dozen of them, for which a dozen numpy operations cost
    more than the comparisons (0.13 -> 0.01 ms a call in the engine on the 2-core Zen 5 EPYC)."""
    n = len(sequence)
    if n < 2 or limit < 1:
        return []
    tokens = sequence.tolist() if isinstance(sequence, np.ndarray) else sequence
    suffix = tokens[max(0, n - max_ngram):][::-1]  # the last token first
    found: list[Match] = []
    for end in (range(n - 1) if ends is None else ends):
        length = 0
        while length < len(suffix) and length <= end and tokens[end - length] == suffix[length]:
            length += 1
        if length >= min_ngram:
            found.append(Match(end, length))
    found.sort(key=lambda match: (-match.length, -match.end))
    return found[:limit]


def lookup_pool(sequence: Sequence[int], tree: TreeSettings, device: torch.device | None = None,
                ends: Iterable[int] | None = None) -> DraftPool:
    """The candidate pool for `sequence` (its last token is the root): the trie of the continuations of
    `find_matches` (`ends` as there), depth by depth, siblings best first. Empty when nothing matches."""
    pool = DraftPool()
    text = sequence.tolist() if isinstance(sequence, np.ndarray) else sequence
    matches = find_matches(text, tree.max_ngram, tree.min_ngram, tree.top_k, ends)
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
        for depth, token in enumerate(text[match.end + 1 : match.end + 1 + tree.depth], start=1):
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
        self._tokens: list[int] = []  # the sequence so far; a Python list, which the matching reads token by token
        self._where: dict[int, list[int]] = {}  # token -> its positions in the sequence: where a match may end
        # The last three tokens -> the positions where those three end: where a match of three or more may end. A
        # learned drafter's switch (tree.lookup_merge) asks every cycle and is mostly told "nowhere" at once.
        self._where3: dict[tuple[int, int, int], list[int]] = {}
        self._first = 0  # the sequence index of the first token kept: 1 when the prompt's first token was never seen
        self._pairs = 0  # pairs received by propose: their tokens are the sequence's tokens 1 .. _pairs

    @property
    def sequence(self) -> np.ndarray:
        """The tokens seen so far, in order (the last one is the current root)."""
        return np.array(self._tokens, dtype=np.int64)

    def observe(self, tokens: torch.Tensor, features: torch.Tensor, logits: torch.Tensor | None = None,
                parents: list[int] | None = None) -> None:
        if parents is None and not self._tokens and self._pairs == 0:  # the prefill: the prompt
            self._append(tokens.tolist())

    def draft(self, features: torch.Tensor, tokens: torch.Tensor, tree: TreeSettings) -> DraftPool:
        self.extend(tokens)
        return self.candidates(tree, tokens.device)

    def extend(self, tokens: torch.Tensor) -> None:
        """Take the newly accepted pairs' tokens (the new root last); those the prefill already gave are skipped."""
        if not self._tokens and self._pairs == 0:
            self._first = 1  # no prompt was observed: the sequence starts at the first pair's token
        start = self._pairs + 1  # the sequence index of tokens[0]
        skip = max(0, self._first + len(self._tokens) - start)  # tokens the prefill already gave
        self._append(tokens[skip:].tolist())
        self._pairs += tokens.shape[0]

    def candidates(self, tree: TreeSettings, device: torch.device | None = None) -> DraftPool:
        """The pool for the sequence so far (its last token the root), matching `tree.min_ngram` tokens or more.
        A learned drafter's run asks twice in some cycles (its switch, then its branches), after one `extend`."""
        tokens = self._tokens
        if tree.min_ngram >= 3 and len(tokens) >= 3:
            earlier = self._where3[(tokens[-3], tokens[-2], tokens[-1])][:-1]
        else:
            earlier = self._where[tokens[-1]][:-1] if tokens else []
        if not earlier:  # the root's own position left out above
            return DraftPool()
        return lookup_pool(tokens, tree, device, earlier)

    def _append(self, tokens: list[int]) -> None:
        last = self._tokens[-2:]
        for position, token in enumerate(tokens, start=len(self._tokens)):
            self._where.setdefault(token, []).append(position)
            last.append(token)
            if len(last) >= 3:
                self._where3.setdefault((last[-3], last[-2], last[-1]), []).append(position)
        self._tokens.extend(tokens)
