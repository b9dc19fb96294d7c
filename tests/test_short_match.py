"""The switch to prompt lookup's tree at matches one token shorter than lookup_merge (short_match.py)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from gumiho.engine import GenerationConfig
from gumiho.profile import KV_LENGTHS, SIZES, ExecPath, PathCost
from gumiho.short_match import PRIOR_CYCLES, PRIOR_EMITTED, ShortMatchSwitch
from gumiho.sizing import Sizer
from gumiho.tree import TreeSettings

from .test_sizing import sized_engine

FIRST_LEVEL = TreeSettings(top_k=2, depth=6, total_tokens=3, mlptopk=6, pruning=6, sized=True, first_level=True,
                           lookup_merge=3)


def cost() -> PathCost:
    return PathCost(ExecPath("float32"), {kv: [20.0 + 2.0 * n for n in SIZES] for kv in KV_LENGTHS}, head_ms=1.0,
                    draft_ms={"gumiho": {2: 4.0}, "eagle2": {2: 3.0}})


def switch_for(path: PathCost) -> ShortMatchSwitch:
    return ShortMatchSwitch(replace(FIRST_LEVEL, min_ngram=2), Sizer(path.cycle_ms), path, draft_ms=4.0, size=3)


def test_lookups_tree_is_taken_where_it_promises_more_tokens_a_millisecond_than_the_drafters_path():
    path = cost()
    switch = switch_for(path)
    prior = PRIOR_CYCLES * PRIOR_EMITTED / (PRIOR_CYCLES * (path.tree_cycle_ms(3, 1.0, 256) + 4.0))
    assert switch.drafter_rate == pytest.approx(prior)
    assert not switch.prefers_lookup(1, 0.0, 256)  # a plain step is never a switch
    assert not switch.prefers_lookup(2, 0.2, 256)  # a short, unsure tree: the drafter's path
    assert switch.prefers_lookup(6, 3.0, 256)  # a long, sure one: lookup's
    for _ in range(20):  # the drafter's path keeps failing: its rate falls, and a surer 2-token tree wins
        switch.record(3, 0, 256, drafted=True)
    assert switch.drafter_rate < prior and switch.prefers_lookup(2, 0.6, 256)
    undrafted, drafted = switch_for(path), switch_for(path)
    undrafted.record(1, 0, 256, drafted=False)
    drafted.record(1, 0, 256, drafted=True)
    assert undrafted.drafter_rate > drafted.drafter_rate  # a skipped draft costs nothing


def switched_cycles(engine, ids, method) -> tuple[list[int], int]:
    run = engine.generate("", method, GenerationConfig(max_new_tokens=40, tree=FIRST_LEVEL), prompt_ids=ids)
    return run.token_ids, sum(s.tree_size > 1 and all(n.source == "lookup" for n in s.nodes[1:]) for s in run.steps)


def test_short_matches_switch_where_lookup_is_preferred_and_the_greedy_output_stays_exact(monkeypatch):
    more = 0
    for seed in range(4):
        engine = sized_engine(seed)
        engine.choice.cost.draft_ms = cost().draft_ms
        ids = torch.randint(0, 16, (12,), generator=torch.Generator().manual_seed(seed)).tolist() * 2
        ar = engine.generate("", "ar", GenerationConfig(max_new_tokens=40), prompt_ids=ids).token_ids
        for method in ("gumiho", "eagle2"):
            learned, _ = switched_cycles(engine, ids, method)
            monkeypatch.setattr(ShortMatchSwitch, "prefers_lookup", lambda self, n, expected, kv: False)
            never, some = switched_cycles(engine, ids, method)
            monkeypatch.setattr(ShortMatchSwitch, "prefers_lookup", lambda self, n, expected, kv: n > 1)
            always, most = switched_cycles(engine, ids, method)
            monkeypatch.undo()
            assert learned == never == always == ar, (seed, method)
            assert most >= some
            more += most > some
    assert more  # short matches did switch


def test_the_rule_runs_in_sized_trees_that_draft_without_branches_only():
    engine = sized_engine(0)
    engine.choice.cost.draft_ms = cost().draft_ms
    ids = [1, 2, 3, 1, 2, 4]

    def rule(tree: TreeSettings, method: str = "gumiho"):
        return engine.run("", method, GenerationConfig(tree=tree), prompt_ids=ids).short_match

    assert isinstance(rule(FIRST_LEVEL), ShortMatchSwitch) and isinstance(rule(FIRST_LEVEL, "eagle2"), ShortMatchSwitch)
    run = engine.run("", "gumiho", GenerationConfig(tree=FIRST_LEVEL), prompt_ids=ids)
    assert run.short_match.sizer is not run.lookup_sizer  # short matches calibrate apart
    assert rule(replace(FIRST_LEVEL, sized=False)) is None  # a fixed tree
    assert rule(replace(FIRST_LEVEL, lookup_branches=1)) is None  # short matches are branches already
    assert rule(replace(FIRST_LEVEL, lookup_merge=1)) is None  # no shorter match than the switch's
    assert rule(replace(FIRST_LEVEL, lookup_merge=0)) is None
    engine.choice.cost.draft_ms = {}
    assert rule(FIRST_LEVEL) is None  # no draft cost measured for the method
