"""Whether a cycle whose text repeats only its last `lookup_merge` - 1 tokens earlier takes prompt lookup's tree.

A match of `lookup_merge` (3) tokens or more always switches a learned drafter's cycle to prompt lookup's tree
(tree.lookup_merge, docs/design.md §17.4). One token shorter, the better source depends on the text: at 2-token
matches the longest match's continuation was right 47% / 71% of the time on CNN/DM / GSM8K against the Gumiho
drafter's 36% / 58%, and 42% / 25% on MT-Bench / Alpaca against its 53% / 67% (teacher-forced; docs/benchmarks.md).
And a match's continuation can be verified several tokens deep where the CPU's first-level trees emit at most two
tokens a cycle. So at such a match the run compares rates, tokens emitted per millisecond of the machine profile's
costs: lookup's sized tree, its expected accepted length read from a calibration of these trees' own (a 2-token
match's continuation is right less often than a 3-token one's on some texts; sizing.py), against what the run's
cycles on the drafter's path have emitted so far for their modelled cost (verification and draft). The drafter's
rate starts from PRIOR_CYCLES cycles that each emit the most a 2-token tree can, so a run starts as it would without
the rule.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .profile import PathCost
from .sizing import Sizer
from .tree import TreeSettings

PRIOR_CYCLES = 2.0
PRIOR_EMITTED = 2.0  # tokens a cycle of the prior emits: a 2-token tree's draft token and the bonus
PRIOR_KV = 256  # the cached tokens the prior's cycles are priced at


@dataclass
class ShortMatchSwitch:
    """One run's rule. `tree`: prompt lookup's settings at the short matches; `sizer`: their trees' own; `cost`: the
    path's costs; `draft_ms`: a draft call of the drafter's tree; `size`: its tree's most tokens."""

    tree: TreeSettings
    sizer: Sizer
    cost: PathCost
    draft_ms: float
    size: int
    emitted: float = field(init=False)
    ms: float = field(init=False)

    def __post_init__(self) -> None:
        self.emitted = PRIOR_CYCLES * PRIOR_EMITTED
        self.ms = PRIOR_CYCLES * (self.cost.tree_cycle_ms(self.size, PRIOR_EMITTED - 1, PRIOR_KV) + self.draft_ms)

    @property
    def drafter_rate(self) -> float:
        """Tokens a millisecond on the drafter's path so far, the prior included."""
        return self.emitted / self.ms

    def prefers_lookup(self, n: int, expected: float, kv: int) -> bool:
        """Whether lookup's tree of n tokens, `expected` draft tokens of it accepted, beats the drafter's rate."""
        return n > 1 and (1.0 + expected) / self.cost.tree_cycle_ms(n, expected, kv) > self.drafter_rate

    def record(self, size: int, accepted: int, kv: int, drafted: bool) -> None:
        """A cycle on the drafter's path: a tree of `size` tokens, `accepted` draft tokens of it accepted; `drafted`:
        the drafter was called (a plain step may skip it)."""
        self.add(1 + accepted, self.cost.tree_cycle_ms(size, accepted, kv) + (self.draft_ms if drafted else 0.0))

    def add(self, tokens: float, ms: float) -> None:
        """Tokens the drafter's path emitted, and their cost (a replay's expected share of a cycle, expected.py)."""
        self.emitted += tokens
        self.ms += ms
