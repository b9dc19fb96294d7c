"""Trees sized per cycle: verify the number of tokens n that maximises expected emitted tokens per millisecond.

A drafter scores its candidates (cumulative draft log-probs; prompt lookup's pseudo log-probs). A tree of n tokens
keeps the best n - 1 of them (tree.build_tree), and the expected number of draft tokens the target accepts from
it is the sum, over the kept nodes, of the probability that each lies on the accepted path. That probability is
read from a calibration of score -> acceptance: per score bin, the share of verified nodes that ended up on the
accepted path (bins of exp(score)). It starts from a prior (exp(score) itself, worth PRIOR_WEIGHT nodes) and
learns from every verification of the run, so it fits the drafter, the target and the text at hand, and needs
no file. Then

    n* = argmax over n of (1 + E[accepted draft tokens | n]) / (T(n) + head rows),

T(n) being the machine profile's cost of verifying n tokens at the current KV length, with one lm_head row, and
the head rows those the acceptance walk reads past the root's: one row of its own per accepted node, except where
the head computes rows together, and the walk computes the draft's likeliest path (up to verify.PREFETCH_ROWS
rows; every row of a tree of verify.ALL_ROWS or fewer) in the root's product whatever is accepted, and only
accepted nodes off it alone. n = 1 is a plain AR step
(the draft is not verified) and wins whenever the draft is too unsure to pay for the extra rows. Which nodes are
kept stays the best-scored subset, so exactness is untouched: only how many is decided here.
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


@dataclass
class Calibration:
    """Score -> the chance that a node of that score is on the accepted path, learnt from a run's verifications."""

    accepted: list[float] = field(default_factory=lambda: [0.0] * BINS)
    seen: list[float] = field(default_factory=lambda: [0.0] * BINS)

    def probability(self, score: float) -> float:
        b = _bin(score)
        prior = (b + 0.5) / BINS  # the draft's own probability: the bin's centre
        return (self.accepted[b] + PRIOR_WEIGHT * prior) / (self.seen[b] + PRIOR_WEIGHT)

    def learn(self, scores: list[float], on_path: list[bool]) -> None:
        """One verification's outcome: each verified draft node's score and whether it was accepted."""
        for score, hit in zip(scores, on_path):
            b = _bin(score)
            self.seen[b] += 1.0
            self.accepted[b] += float(hit)


@dataclass
class Sizer:
    """Per-cycle n for one run. `cost(n, together, alone, kv)`: the ms of verifying n tokens on a KV cache of kv
    tokens with `together` lm_head rows computed in the root's product and `alone` (expected) one at a time
    (`PathCost.cycle_ms`). `together`: whether the head computes rows together (the walk's prefetch)."""

    cost: Callable[[int, float, float, int], float]
    together: bool = False
    calibration: Calibration = field(default_factory=Calibration)

    def probability(self, score: float) -> float:
        """Calibrated chance that a node of this score is on the accepted path."""
        return self.calibration.probability(score)

    def learn(self, scores: list[float], on_path: list[bool]) -> None:
        self.calibration.learn(scores, on_path)

    def could_pay(self, score: float, most: int, kv: int) -> bool:
        """Whether a tree of up to `most` tokens whose best node scores `score` could beat a plain step: an upper
        bound, every node taken at that node's chance (none ranks above the best) and priced at T(n) alone, without
        its head rows. False: `choose` would take n = 1 for any such pool, so the draft need not be made."""
        p = self.probability(score)
        step = self.cost(1, 0.0, 0.0, kv)
        return any((1.0 + (n - 1) * p) * step > self.cost(n, 0.0, 0.0, kv) for n in range(2, most + 1))

    def choose(self, pool: DraftPool, most: int, kv: int, calibrated: bool = False) -> tuple[int, float]:
        """(n, expected accepted draft tokens) for `pool`, n at most `most`. The nodes are taken in the order
        `build_tree` keeps them (priority for a static tree, else score). `calibrated`: the scores are already the
        log of each node's chance (tree.merge_pools), read as they are."""
        if not pool.size or most < 2:
            return 1, 0.0
        # Python lists, not tensor operations: a CPU's sized pools hold a few nodes, and four tensor calls cost more.
        scores = [x for layer in pool.scores for x in layer.tolist()]
        order = [x for layer in pool.priorities for x in layer.tolist()] if pool.priorities else scores
        parents = [x for layer in pool.parents for x in layer.tolist()]
        kept = sorted(range(len(order)), key=order.__getitem__, reverse=True)[: most - 1]  # stable: ties keep order
        chance = math.exp if calibrated else self.probability
        best_n, best_rate, expected, best_expected = 1, 1.0 / self.cost(1, 0.0, 0.0, kv), 0.0, 0.0
        # The prefetched path: from the root, each node's first kept child (the best-ranked one), PREFETCH_ROWS rows;
        # a tree of ALL_ROWS rows or fewer has every row in that product (verify._prefetch_likeliest).
        path_end, together, alone = -1, 0, 0.0
        ranked = ((node, parents[node], scores[node]) for node in kept)
        for i, (node, parent, score) in enumerate(ranked, start=2):
            p = chance(score)
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
