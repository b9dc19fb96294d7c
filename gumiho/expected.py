"""What prompt lookup adds to a method's expected speed-up: its cycles replayed on real text.

The tree choice (choice.py) expects a drafter's cycles from its acceptance statistics. Two parts of a run's policy
are not in them: prompt lookup's switch (a cycle whose last `lookup_merge` tokens occurred earlier verifies
lookup's tree instead of drafting, tree.lookup_tree) and prompt lookup run as a method of its own. Both depend only
on the text, and lookup's drafts are a function of the text so far (drafters/lookup.py `lookup_pool`), so they are
replayed here on the machine profile's texts (the fastest path's greedy replies to calibration prompts,
profile.greedy_texts): cycle by cycle from the first reply token, lookup's pool at that point, sized per cycle by a
`Sizer` that learns as the engine's does, the tokens the target would accept (the reply itself, greedy) and the
profile's cost of that cycle. Where lookup has no pool, the position is the rest of the policy's: a drafted cycle
(or a plain step) of the method's own, unless the run's short-match rule (short_match.py) takes lookup's tree at a
match one token shorter, which the replay decides as a run does, against the drafter's path's expected rate.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .drafters.lookup import lookup_pool
from .profile import PathCost
from .short_match import ShortMatchSwitch
from .sizing import Sizer
from .tree import DraftPool, DraftTree, TreeSettings, build_tree


@dataclass
class Replay:
    """Lookup's cycles over some texts, and the positions it left to the rest of the policy."""

    lookup_tokens: int  # tokens lookup's cycles emitted (accepted draft tokens and the bonus token)
    lookup_ms: float  # what those cycles cost: the lookup draft and the verification, head rows included
    other_kv: list[int]  # the KV length at each position lookup left to the rest (one token each)
    ar_ms: float  # what AR steps over the same tokens cost


def accepted(tree: DraftTree, following: list[int]) -> tuple[int, list[bool]]:
    """The draft tokens a greedy target accepts from `tree` when the text goes on with `following`, and whether each
    non-root node lies on the accepted path."""
    children, tokens = tree.children(), tree.tokens.tolist()
    node, path = 0, []
    for token in following:
        node = next((c for c in children[node] if tokens[c] == token), -1)
        if node < 0:
            break
        path.append(node)
    on_path = set(path)
    return len(path), [i in on_path for i in range(1, len(tokens))]


@dataclass(frozen=True)
class ShortMatches:
    """A method's short-match rule, for the replay: prompt lookup's settings at matches one token shorter than the
    switch's; what the drafter's path is expected to cost a token at a KV length (its positions' price, and so the
    rate the rule weighs lookup's trees against); and a draft call and the most tokens of the drafter's tree (the
    rule's prior, as a run's)."""

    tree: TreeSettings
    per_token: Callable[[int], float]
    draft_ms: float
    size: int


def replay(texts: list[tuple[int, list[int]]], tree: TreeSettings, cost: PathCost, draft_ms: float,
           short: ShortMatches | None = None) -> Replay:
    """Prompt lookup's cycles under `tree` (its n-gram sizes, width and most verified tokens) over `texts` ((prompt
    length, ids) each), sized per cycle as a run sizes them, each costing `draft_ms` to draft; with `short`, also
    the short matches' cycles that the run's rule would take."""
    lookup_tokens, lookup_ms, other_kv, ar_ms = 0, 0.0, [], 0.0
    for prompt_length, ids in texts:
        sizer = Sizer(cost.cycle_ms, cost.head_together)  # a run's own: it learns from this text's cycles
        switch = (ShortMatchSwitch(short.tree, Sizer(cost.cycle_ms, cost.head_together), cost, short.draft_ms,
                                   short.size) if short else None)
        root = prompt_length  # the first reply token is the first cycle's root
        where: dict[int, list[int]] = {}  # token -> its positions before the root: where a match may end
        for position in range(root):
            where.setdefault(ids[position], []).append(position)
        while root < len(ids) - 1:
            kv = root  # the cache holds every token before the root
            ends = where.get(ids[root], [])
            pool, cycle_sizer, n = lookup_pool(ids[: root + 1], tree, ends=ends), sizer, 0
            if pool.size:
                n, _ = sizer.choose(pool, tree.total_tokens, kv)
                sizer.watch(pool, n, tree.total_tokens, kv)
            elif switch is not None:
                near = lookup_pool(ids[: root + 1], switch.tree, ends=ends)
                if near.size:
                    n, expected = switch.sizer.choose(near, tree.total_tokens, kv)
                    if switch.prefers_lookup(n, expected, kv):
                        pool, cycle_sizer = near, switch.sizer
                    switch.sizer.watch(near, n if pool is near else 1, tree.total_tokens, kv)
            if not pool.size:
                other_kv.append(kv)
                ar_ms += cost.verify_at(1, kv)
                if switch is not None:
                    switch.add(1.0, short.per_token(kv))
                emitted = 1
            else:
                emitted, cycle_ms = _cycle(ids, root, pool, n, cost, cycle_sizer, kv)
                lookup_tokens += emitted
                lookup_ms += draft_ms + cycle_ms
                ar_ms += sum(cost.verify_at(1, kv + i) for i in range(emitted))
            for position in range(root, root + emitted):
                where.setdefault(ids[position], []).append(position)
            root += emitted
            for learner in (sizer, switch and switch.sizer):
                if learner:  # as a run's sizers: what the text has decided so far, the new root included
                    learner.settle(ids[: root + 1])
    return Replay(lookup_tokens, lookup_ms, other_kv, ar_ms)


def _cycle(ids: list[int], root: int, pool: DraftPool, n: int, cost: PathCost, sizer: Sizer,
           kv: int) -> tuple[int, float]:
    """One lookup cycle at `root` verifying the n best nodes of `pool`: the tokens it emits and its verification's
    cost; the sizer learns from it."""
    drafted = build_tree(ids[root], pool, n)
    count, hits = accepted(drafted, ids[root + 1:])
    sizer.learn(drafted.scores[1:], hits, drafted.depths[1:])
    return min(count + 1, len(ids) - 1 - root), cost.tree_cycle_ms(n, count, kv)


def speedup(run: Replay, other_ms_per_token: Callable[[int], float]) -> float:
    """Expected speed over AR's when every position lookup left costs `other_ms_per_token(kv)`; 1.0 with no text."""
    total = run.lookup_ms + sum(other_ms_per_token(kv) for kv in run.other_kv)
    return run.ar_ms / total if total > 0 else 1.0
