"""Automatic settings: the execution path (dtype, forward, packing) and each method's tree, from a measurement.

Two inputs, kept apart because they change for different reasons:
  - the machine profile (`profile.py`): what a verification of n tokens and a draft call cost on this machine;
  - the drafter's acceptance statistics (`acceptance.json` in its folder, written by `python -m gumiho calibrate`):
    for greedy calibration runs with the widest tree of each top_k, the score ranks of the accepted nodes. The
    tree of total_tokens = n keeps the best n - 1 nodes of the same pool, so the accepted length it would have
    given is the number of leading accepted nodes whose running maximum rank is below n - 1. These depend on the
    drafter and the target, not on the machine.

expected tokens/s (n, k) = 1000 * tau(n, k) / (draft_ms(k, n) + verify_ms(n) + head rows); AR is 1000 / verify_ms(1).
A verification computes the lm_head row of each accepted token and of the one after: one row of its own each
(head_ms), or, where the head computes rows together, the first min(n, 4) rows of the tree in one product
(head_ms each past the first) and any accepted past them alone (`PathCost.tree_cycle_ms`). A cheaper tree
expected nearly as fast is preferred (CHEAPER_WITHIN).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from .acceptance import Acceptance
from .errors import GumihoError
from .expected import Replay, ShortMatches, replay, speedup
from .profile import SHORT, SIZES, ExecPath, MachineProfile, PathCost, widest_tree
from .trace import METHOD_NAMES
from .tree import FIRST_LEVEL_METHODS, TreeSettings
from .verify import ALL_ROWS

KV_TYPICAL = 512  # the KV length the choice is made for: a prompt plus a few hundred generated tokens
# Among drafting trees, the cheapest cycle expected within this share of the fastest is taken. The model leaves out
# costs that grow with the tree outside the draft call and the target forward (the drafter's next advance over more
# accepted tokens, the pool and tree bookkeeping, the walk): side by side on a 2-core Zen 4 EPYC, a 3-token tree it
# rated 1% below a 2-token one ran 6-9% slower (docs/benchmarks.md, "A CPU with bf16 units").
CHEAPER_WITHIN = 0.05
# A screened path (profile.measure) is ruled out only where it would lose even this many times faster than its
# one-token steps were timed: a busy moment on a shared machine slows a step by 10-15%.
SCREEN_SLACK = 1.25


class Unmeasured(GumihoError):
    """The choice asked for needs these screened paths timed in full (`profile.complete`) before it can pick."""

    def __init__(self, paths: list[ExecPath]):
        super().__init__("the machine profile has not timed " + ", ".join(p.label for p in paths) + " in full")
        self.paths = paths


@dataclass
class MethodChoice:
    method: str
    tree: TreeSettings | None  # None for AR
    tokens_per_s: float  # expected, from the profile
    speedup: float  # expected, over AR on the same path
    note: str = ""  # why the tree is not a measured choice, when it is not


@dataclass
class Choice:
    """The automatic settings and why: `summary(method)` is what the CLI, the app and the bench print."""

    path: ExecPath
    methods: dict[str, MethodChoice]
    reason: str  # why this path: the alternatives' expected speeds
    units: str = ""  # the hardware behind a half-precision path ("AMX", "AVX512-BF16", "GPU")
    cost: PathCost | None = None  # the chosen path's measured costs (per-cycle sizing reads T(n) from it)

    def summary(self, method: str) -> str:
        units = self.path.dtype in ("bfloat16", "float16") and self.units
        head = SHORT[self.path.dtype] + (f" ({units})" if units else "") + f", {self.path.forward} forward"
        m = self.methods.get(method)
        if m is None or m.tree is None:
            return f"{head}, AR: expected {m.tokens_per_s:.0f} tokens/s" if m else head
        n = m.tree.total_tokens
        tree = f"{METHOD_NAMES.get(method, method)} tree {n} token{'s' if n != 1 else ''}, top_k {m.tree.top_k}"
        if m.tree.first_level:
            tree += ", first level"
        return f"{head}, {tree}: expected {m.speedup:.2f}x over AR while decoding" + (f" ({m.note})" if m.note else "")

    def to_dict(self) -> dict:
        return {"path": {"dtype": self.path.dtype, "forward": self.path.forward, "pack": self.path.pack},
                "reason": self.reason, "units": self.units,
                "methods": {m: {"tree": c.tree.to_dict() if c.tree else None, "tokens_per_s": round(c.tokens_per_s, 2),
                                "speedup": round(c.speedup, 3), "note": c.note} for m, c in self.methods.items()}}




def best_tree(cost: PathCost, method: str, base: TreeSettings, acceptance: Acceptance | None,
              top_k: int | None = None, total_tokens: int | None = None) -> MethodChoice:
    """The (top_k, total_tokens) with the cheapest cycle among those expected within CHEAPER_WITHIN of the highest
    tokens/s on this path, in the calibrated tree family (`profile.widest_tree`) with `base`'s FTA setting; AR
    steps where no tree is expected faster than AR; fixed values are kept."""
    ar = 1e3 / cost.verify_at(1, KV_TYPICAL)
    known = acceptance is not None and cost.draft_ms.get(method)
    top_ks = [top_k] if top_k else sorted(cost.draft_ms.get(method, {}))
    top_ks = [k for k in top_ks if known and k in acceptance.prefix_ranks and k in cost.draft_ms[method]]
    if not top_ks:
        sized = not total_tokens and method != "mjsd"
        tree = replace(base, **{k: v for k, v in (("top_k", top_k), ("total_tokens", total_tokens)) if v},
                       sized=sized, lookup_branches=0 if sized else base.lookup_branches)
        why = "no acceptance statistics for this drafter" if acceptance is None else "top_k not profiled"
        return MethodChoice(method, tree, ar, 1.0, f"{why}: default tree")
    trees = []  # (expected tokens/s, cycle ms, top_k, n)
    for k in top_ks:
        widest = widest_tree(method, k)
        sizes = [total_tokens] if total_tokens else [n for n in SIZES if 2 <= n <= widest.total_tokens]
        for n in sizes:
            tau = acceptance.tau(k, n)
            cycle = cost.draft_at(method, k, n) + cost.tree_cycle_ms(n, tau - 1, KV_TYPICAL)
            trees.append((1e3 * tau / cycle, cycle, k, n))
    fastest = max((rate for rate, *_ in trees), default=0.0)
    near = [t for t in trees if t[0] * (1 + CHEAPER_WITHIN) >= fastest]
    rate, k, n = ar, top_ks[0], 1  # AR steps, unless a tree is expected faster (or the size is fixed)
    if near:
        cheapest = min(near, key=lambda t: t[1])
        if total_tokens or cheapest[0] > ar:
            rate, _, k, n = cheapest
    # Prompt lookup's branches (design.md §17.5) pay in a fixed tree; in a sized one on a CPU they were measured
    # even (the sizer spends their chance on rows that cost what they return), so a sized tree goes without.
    sized = not total_tokens and method != "mjsd" and n > 1
    first_level = False
    if sized and n == 2 and method in FIRST_LEVEL_METHODS and cost.head_together and not base.fta:
        # Where the head computes rows together, a sized 2-token tree widens to its first level's best ALL_ROWS - 1
        # candidates: the same draft, the second candidate's lm_head row in the root's product, and the sizer
        # verifies it in the cycles where its chance pays for it. The model cannot tell those cycles apart, so the
        # tree is rated at its 2-token core (a lower bound), at the narrowest near top_k that has the candidates (a
        # wider one drafts candidates the tree never keeps).
        wide = [t for t in near if t[3] == 2 and t[2] >= ALL_ROWS - 1]
        if wide:
            rate, _, k, _ = min(wide, key=lambda t: t[2])
            n, first_level = ALL_ROWS, True
    tree = replace(widest_tree(method, k), total_tokens=n, fta=base.fta, lookup_merge=base.lookup_merge, sized=sized,
                   lookup_branches=0 if sized else base.lookup_branches, first_level=first_level)
    return MethodChoice(method, tree, rate, rate / ar, "" if n > 1 else "drafting does not pay here: AR steps")


def rate_bound(cost: PathCost, method: str, acceptance: Acceptance | None, top_k: int | None = None,
               total_tokens: int | None = None) -> float:
    """The most tokens/s that `best_tree` could expect of `method` on `cost`'s path: each of its trees' tau over
    T(n) alone, as if the draft and the head rows were free; AR's rate where the statistics give no tree. A
    screened path's curves are lower bounds, and so this bounds what its full timing would give."""
    rate = 1e3 / cost.verify_at(1, KV_TYPICAL)
    if acceptance is None or method == "ar":
        return rate
    for k in [top_k] if top_k else sorted(acceptance.prefix_ranks):
        if k not in acceptance.prefix_ranks:
            continue
        sizes = [total_tokens] if total_tokens else [n for n in SIZES if 2 <= n <= widest_tree(method, k).total_tokens]
        for n in sizes:
            rate = max(rate, 1e3 * acceptance.tau(k, n) / cost.verify_at(n, KV_TYPICAL))
    return rate


def outpaced(screened: PathCost, timed: PathCost, methods: list[str], acceptance: dict[str, Acceptance | None],
             device_type: str) -> bool:
    """Whether the `screened` path cannot be the fastest for any of `methods` at automatic trees: SCREEN_SLACK times
    its `rate_bound` stays below what the choice expects of each method on the path `timed` in full."""
    for method in methods:
        if method == "ar":
            expected = 1e3 / timed.verify_at(1, KV_TYPICAL)
        else:
            expected = best_tree(timed, method, TreeSettings.default(method, device_type),
                                 acceptance.get(method)).tokens_per_s
        if SCREEN_SLACK * rate_bound(screened, method, acceptance.get(method)) >= expected:
            return False
    return True


def rated_size(tree: TreeSettings) -> int:
    """The size at which the model rates a tree: a first-level tree at its 2-token core (`best_tree`)."""
    return 2 if tree.first_level else tree.total_tokens


def choose(profile: MachineProfile, methods: list[str], lead: str, acceptance: dict[str, Acceptance | None],
           device_type: str, dtype: str | None = None, top_k: int | None = None,
           total_tokens: int | None = None, auto_trees: bool = True, units: str = "") -> Choice:
    """Pick the path that makes `lead` fastest (an explicit `dtype` narrows the paths to it), then each method's
    tree on that path (`auto_trees` False: the device's default trees, with their expected speed)."""
    costs = [c for c in profile.costs if dtype in (None, c.path.dtype)]
    if not costs:
        raise GumihoError(f"the machine profile has no {dtype} path")

    def tree_size(m: str) -> tuple[int | None, int | None]:
        if auto_trees or m == "ar":
            return top_k, total_tokens
        base = TreeSettings.default(m, device_type)
        return base.top_k, base.total_tokens

    def plan(cost: PathCost) -> dict[str, MethodChoice]:
        out = {}
        ar = 1e3 / cost.verify_at(1, KV_TYPICAL)
        for m in methods:
            if m == "ar":
                out[m] = MethodChoice("ar", None, ar, 1.0)
            else:
                out[m] = best_tree(cost, m, TreeSettings.default(m, device_type), acceptance.get(m), *tree_size(m))
        return out

    plans = [(cost, plan(cost)) for cost in costs if not cost.screened]
    plans.sort(key=lambda p: -p[1][lead].tokens_per_s)
    bounds = [(c, SCREEN_SLACK * rate_bound(c, lead, acceptance.get(lead), *tree_size(lead)))
              for c in costs if c.screened]
    unsure = [c.path for c, bound in bounds if not plans or bound >= plans[0][1][lead].tokens_per_s]
    if unsure:
        raise Unmeasured(unsure)
    cost, chosen = plans[0]
    others = "; ".join([f"{c.path.label} {p[lead].tokens_per_s:.1f}" for c, p in plans]
                       + [f"{c.path.label} under {bound:.1f} (its one-token step only)" for c, bound in bounds])
    reason = f"expected {METHOD_NAMES.get(lead, lead)} tokens/s per path: {others}"
    if profile.texts:
        replays: dict[str, Replay] = {}  # by tree: the learned methods' switches are one tree, replayed once
        chosen = {m: with_lookup(c, cost, profile.texts, device_type, acceptance.get(m), replays)
                  for m, c in chosen.items()}
    return Choice(path=cost.path, methods=chosen, reason=reason, units=units, cost=cost)


def with_lookup(choice: MethodChoice, cost: PathCost, texts: list[tuple[int, list[int]]], device_type: str,
                acceptance: Acceptance | None, replays: dict[str, Replay]) -> MethodChoice:
    """`choice` with its expectation counting prompt lookup (expected.py): prompt lookup's own cycles, or a
    method's switch to them (and its run's short-match rule), replayed on the profile's texts; the positions lookup
    leaves cost a drafted cycle's share (acceptance statistics at the chosen tree), or a plain step where the method
    takes AR steps, or a plain step and a draft where its drafts have no statistics (a lower bound: none of them
    counted accepted).
    On the 2-core Zen 5 EPYC, decoding the profile's own 16 prompts, expected / measured: EAGLE-2 1.23x / 1.28x,
    Gumiho 1.26x / 1.27-1.29x, prompt lookup 1.13x / 1.11-1.14x, Token Recycling 1.06x / 1.10-1.11x (before the
    short matches were replayed: 1.20x, 1.23x, 1.13x, 1.02x) (docs/design.md §15)."""
    tree, method = choice.tree, choice.method
    lookup = method == "lookup"
    if tree is None or not (lookup or tree.lookup_merge):
        return choice
    switch = tree if lookup else tree.lookup_tree(device_type)
    draft = cost.draft_at("lookup", switch.top_k, switch.total_tokens) if cost.draft_ms.get("lookup") else 0.0
    n, k = rated_size(tree), tree.top_k
    drafts = not lookup and n > 1  # the positions lookup leaves are drafted cycles (else plain steps)
    measured = k in cost.draft_ms.get(method, {})
    known = drafts and measured and acceptance is not None and k in acceptance.prefix_ranks
    tau = acceptance.tau(k, n) if known else 1.0

    def per_token(kv: int) -> float:
        if known:
            return (cost.draft_at(method, k, n) + cost.tree_cycle_ms(n, tau - 1, kv)) / tau
        if drafts and measured:  # a draft paid for, none of its tokens counted: a lower bound
            return cost.draft_at(method, k, n) + cost.verify_at(1, kv)
        return cost.verify_at(1, kv)

    # A run's short-match rule (engine.Run): sized trees that draft, at matches one token shorter than the switch's.
    short = (ShortMatches(replace(switch, min_ngram=switch.min_ngram - 1), per_token,
                          cost.draft_at(method, k, tree.total_tokens), tree.total_tokens)
             if drafts and measured and tree.sized and switch.min_ngram > 1 else None)
    key = repr(switch) + (f" short matches of {method}" if short else "")  # the rule weighs the method's own rate
    if key not in replays:
        replays[key] = replay(texts, switch, cost, draft, short)
    gain = speedup(replays[key], per_token)
    note = choice.note if not lookup else ""
    if drafts and not known:  # Token Recycling, and any drafter not calibrated
        note = (f"a lower bound: prompt lookup's switch counted, {METHOD_NAMES.get(method, method)}'s own drafts "
                f"have no acceptance statistics")
    ar = choice.tokens_per_s / choice.speedup
    return replace(choice, tokens_per_s=ar * gain, speedup=gain, note=note)
