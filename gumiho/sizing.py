"""Trees sized per cycle: verify the number of tokens n that maximises expected emitted tokens per millisecond.

A drafter scores its candidates (cumulative draft log-probs; prompt lookup's pseudo log-probs). A tree of n tokens
keeps the best n - 1 of them (tree.build_tree), and the expected number of draft tokens the target accepts from
it is the sum, over the kept nodes, of the probability that each lies on the accepted path. That probability is
read from a calibration of score -> acceptance: per score bin, the share of nodes that ended up on the accepted
path (bins of exp(score)), apart for the root's children and for deeper nodes: at one score a deeper node is right
less often than a first one (on the 2-core Zen 5 EPYC, a first prompt-lookup node scoring 0.13-0.25 was right
30-34% of the time and a deeper one 10-15%). It starts from a prior (exp(score) itself, worth PRIOR_WEIGHT nodes)
and learns from every cycle of the run, so it fits the drafter, the target and the text at hand, and needs no
file. Then

    n* = argmax over n of (1 + E[accepted draft tokens | n]) / (T(n) + head rows),

T(n) being the machine profile's cost of verifying n tokens at the current KV length, with one lm_head row, and
the head rows those the acceptance walk reads past the root's: one row of its own per accepted node, except where
the head computes rows together, and the walk computes the draft's likeliest path (up to verify.PREFETCH_ROWS
rows; every row of a tree of verify.ALL_ROWS or fewer) in the root's product whatever is accepted, and only
accepted nodes off it alone. n = 1 is a plain AR step
(the draft is not verified) and wins whenever the draft is too unsure to pay for the extra rows. Which nodes are
kept stays the best-scored subset, so exactness is untouched: only how many is decided here.

A calibration fed only by verified nodes never hears again of a score bin it stopped verifying: one early miss
can talk a bin down to a chance at which no cycle verifies it, however often its nodes turn out right. So the
nodes a cycle weighed and left out (`watch`) are learnt in hindsight once the text is known that far (`settle`):
a node is right where its path's tokens are the tokens the target went on to emit, the same outcome a verified
node's acceptance records (for a one-hot draft under sampling too: both happen with the target's probability).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

from .tree import DraftPool
from .verify import ALL_ROWS, PREFETCH_ROWS

BINS = 16  # bins of exp(score), the draft's own probability, over [0, 1]
PRIOR_WEIGHT = 2.0


def _bin(score: float) -> int:
    return min(BINS - 1, int(math.exp(min(score, 0.0)) * BINS))


def _cell(score: float, depth: int) -> int:
    """The calibration's cell: the score's bin, among the root's children (depth 1) or the deeper nodes."""
    return _bin(score) + (BINS if depth > 1 else 0)


@dataclass
class Calibration:
    """(score, depth) -> the chance that such a node is on the accepted path, learnt from a run's outcomes."""

    accepted: list[float] = field(default_factory=lambda: [0.0] * 2 * BINS)
    seen: list[float] = field(default_factory=lambda: [0.0] * 2 * BINS)

    def probability(self, score: float, depth: int) -> float:
        cell = _cell(score, depth)
        prior = (cell % BINS + 0.5) / BINS  # the draft's own probability: the bin's centre
        return (self.accepted[cell] + PRIOR_WEIGHT * prior) / (self.seen[cell] + PRIOR_WEIGHT)

    def learn(self, scores: list[float], on_path: list[bool], depths: list[int]) -> None:
        """Outcomes: each draft node's score, whether it was on the accepted path, and its depth."""
        for score, hit, depth in zip(scores, on_path, depths):
            cell = _cell(score, depth)
            self.seen[cell] += 1.0
            self.accepted[cell] += float(hit)


@dataclass
class Sizer:
    """Per-cycle n for one run. `cost(n, together, alone, kv)`: the ms of verifying n tokens on a KV cache of kv
    tokens with `together` lm_head rows computed in the root's product and `alone` (expected) one at a time
    (`PathCost.cycle_ms`). `together`: whether the head computes rows together (the walk's prefetch)."""

    cost: Callable[[int, float, float, int], float]
    together: bool = False
    calibration: Calibration = field(default_factory=Calibration)
    # Nodes weighed and not verified: (sequence position of the path's first token, the path's tokens, score).
    pending: list[tuple[int, list[int], float]] = field(default_factory=list)
    # (pool, its size, most, its ranking): `watch` reads the ranking `choose` just made of the same pool
    _last: tuple = field(default=(None, 0, 0, None), init=False, repr=False)

    def probability(self, score: float, depth: int = 1) -> float:
        """Calibrated chance that a node of this score and depth is on the accepted path."""
        return self.calibration.probability(score, depth)

    def learn(self, scores: list[float], on_path: list[bool], depths: list[int]) -> None:
        self.calibration.learn(scores, on_path, depths)

    def could_pay(self, score: float, most: int, kv: int) -> bool:
        """Whether a tree of up to `most` tokens whose best node scores `score` could beat a plain step: an upper
        bound, every node taken at that node's chance (none ranks above the best) and priced at T(n) alone, without
        its head rows. False: `choose` would take n = 1 for any such pool, so the draft need not be made."""
        p = max(self.probability(score, 1), self.probability(score, 2))
        step = self.cost(1, 0.0, 0.0, kv)
        return any((1.0 + (n - 1) * p) * step > self.cost(n, 0.0, 0.0, kv) for n in range(2, most + 1))

    def choose(self, pool: DraftPool, most: int, kv: int, calibrated: bool = False) -> tuple[int, float]:
        """(n, expected accepted draft tokens) for `pool`, n at most `most`. The nodes are taken in the order
        `build_tree` keeps them (priority for a static tree, else score). `calibrated`: the scores are already the
        log of each node's chance (tree.merge_pools), read as they are."""
        if not pool.size or most < 2:
            return 1, 0.0
        kept, scores, parents = self._ranked(pool, most)
        depths = pool.depths
        chance = (lambda score, depth: math.exp(score)) if calibrated else self.probability
        best_n, best_rate, expected, best_expected = 1, 1.0 / self.cost(1, 0.0, 0.0, kv), 0.0, 0.0
        # The prefetched path: from the root, each node's first kept child (the best-ranked one), PREFETCH_ROWS rows;
        # a tree of ALL_ROWS rows or fewer has every row in that product (verify._prefetch_likeliest).
        path_end, together, alone = -1, 0, 0.0
        ranked = ((node, parents[node], scores[node]) for node in kept)
        for i, (node, parent, score) in enumerate(ranked, start=2):
            p = chance(score, depths[node])
            expected += p
            if self.together and parent == path_end and together + 1 < PREFETCH_ROWS:
                path_end, together = node, together + 1
            else:
                alone += p
            small = self.together and i <= ALL_ROWS
            rate = (1.0 + expected) / self.cost(i, i - 1 if small else together, 0.0 if small else alone, kv)
            if rate > best_rate:
                best_n, best_rate, best_expected = i, rate, expected
        return best_n, best_expected

    def watch(self, pool: DraftPool, verified: int, most: int, kv: int) -> None:
        """Keep the nodes `choose` weighed for a tree of up to `most` tokens past the first `verified` - 1 (those
        the tree verifies), to learn in hindsight; the root sits at sequence position `kv`."""
        if not pool.size or verified >= most:
            return
        kept, scores, parents = self._ranked(pool, most)
        tokens = [x for layer in pool.tokens for x in layer.tolist()]
        for node in kept[verified - 1:]:
            path = [node]
            while parents[path[-1]] >= 0:
                path.append(parents[path[-1]])
            self.pending.append((kv + 1, [tokens[i] for i in reversed(path)], scores[node]))

    def settle(self, sequence: list[int], offset: int = 0) -> None:
        """Learn each watched node the text now decides: right where its path is what was emitted, wrong from the
        first token that differs. `sequence[i]` sits at position `offset` + i."""
        known = offset + len(sequence)
        waiting = []
        for start, path, score in self.pending:
            seen = sequence[start - offset:min(start + len(path), known) - offset]
            if seen != path[:len(seen)]:
                self.calibration.learn([score], [False], [len(path)])
            elif len(seen) == len(path):
                self.calibration.learn([score], [True], [len(path)])
            else:
                waiting.append((start, path, score))
        self.pending = waiting

    def _ranked(self, pool: DraftPool, most: int) -> tuple[list[int], list[float], list[int]]:
        """The `most` - 1 nodes a tree of `most` tokens would keep, best first, with every node's score and
        parent; the latest pool's kept for `watch`. Python lists, not tensor operations: a CPU's sized pools hold a
        few nodes, and four tensor calls cost more."""
        last_pool, last_size, last_most, ranking = self._last
        if pool is last_pool and pool.size == last_size and most == last_most:
            return ranking
        scores = [x for layer in pool.scores for x in layer.tolist()]
        order = [x for layer in pool.priorities for x in layer.tolist()] if pool.priorities else scores
        parents = [x for layer in pool.parents for x in layer.tolist()]
        kept = sorted(range(len(order)), key=order.__getitem__, reverse=True)[: most - 1]  # stable: ties keep order
        self._last = (pool, pool.size, most, (kept, scores, parents))
        return kept, scores, parents
