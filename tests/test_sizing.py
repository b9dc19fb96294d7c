"""Trees sized per cycle from a calibration learned during the run, and the switch to prompt lookup's tree: both
change how many and which candidates are verified, never the output."""

from __future__ import annotations

import math
from dataclasses import replace

import torch

from gumiho.choice import Choice
from gumiho.engine import GenerationConfig
from gumiho.profile import KV_LENGTHS, SIZES, ExecPath, PathCost
from gumiho.sizing import Sizer
from gumiho.tree import DraftPool, TreeSettings

from .conftest import tiny_engine


def chain_pool(scores: list[float]) -> DraftPool:
    pool = DraftPool()
    parent = torch.tensor([-1])
    for depth, score in enumerate(scores, start=1):
        parent = pool.add(torch.tensor([depth]), parent, torch.tensor([score]), "eagle-1", depth)
    return pool


def linear_cost(n: int, together: float, alone: float, kv: int) -> float:
    return 20.0 + 5.0 * (n - 1) + 1.0 * (together + alone)  # each verified token costs a quarter of a step


def test_a_sure_draft_is_verified_deep_and_an_unsure_one_not_at_all():
    sizer = Sizer(linear_cost)
    n, expected = sizer.choose(chain_pool([-0.01, -0.02, -0.03, -0.05]), most=5, kv=100)
    assert n == 5 and 3.0 < expected < 4.0
    assert sizer.choose(chain_pool([-4.0, -5.0, -6.0]), most=4, kv=100) == (1, 0.0)  # plain AR step
    assert sizer.choose(chain_pool([-0.01, -0.02]), most=2, kv=100)[0] == 2  # the cap
    assert sizer.choose(DraftPool(), most=8, kv=100) == (1, 0.0)


def test_rows_off_the_prefetched_path_are_costed_alone():
    """Where the head computes rows together, the walk prefetches the likeliest path (each node's best kept child,
    up to PREFETCH_ROWS rows with the root's): the sizer costs those rows whatever is accepted, and a kept node off
    that path at its chance of being read alone."""
    calls = []

    def cost(n: int, together: float, alone: float, kv: int) -> float:
        calls.append((n, together, round(alone, 6)))
        return 10.0 + n

    pool = DraftPool()
    first = pool.add(torch.tensor([5, 6]), torch.tensor([-1, -1]), torch.tensor([-0.1, -2.0]), "serial-1", 1)
    pool.add(torch.tensor([7]), first[:1], torch.tensor([-0.3]), "serial-2", 2)
    sizer = Sizer(cost, together=True)
    sizer.choose(pool, most=4, kv=100, calibrated=True)
    # ranked: token 5 (on the path), its child 7 (on the path), then 6 (a sibling of 5: off the path)
    assert calls == [(1, 0, 0.0), (2, 1, 0.0), (3, 2, 0.0), (4, 2, round(math.exp(-2.0), 6))]
    calls.clear()
    Sizer(cost).choose(pool, most=4, kv=100, calibrated=True)  # rows one at a time: every accepted row alone
    assert [c[1] for c in calls] == [0, 0, 0, 0]
    assert calls[-1][2] == round(math.exp(-0.1) + math.exp(-0.3) + math.exp(-2.0), 6)
    calls.clear()
    Sizer(cost, together=True).choose(chain_pool([-0.01] * 6), most=7, kv=100, calibrated=True)
    assert [c[1] for c in calls] == [0, 1, 2, 3, 3, 3, 3]  # PREFETCH_ROWS rows in one product, the root's included
    assert calls[-1][2] == round(3 * math.exp(-0.01), 6)


def test_every_row_of_a_tree_of_all_rows_or_fewer_is_costed_in_the_roots_product():
    """Two candidates side by side under the root (a first-level tree): with 3 rows the walk computes all of them
    together (verify.ALL_ROWS), so the sibling costs a row of the product, not its chance of a row alone; a fourth
    row off the path is costed alone again."""
    calls = []

    def cost(n: int, together: float, alone: float, kv: int) -> float:
        calls.append((n, together, round(alone, 6)))
        return 10.0 + n

    pool = DraftPool()
    pool.add(torch.tensor([5, 6, 8]), torch.tensor([-1, -1, -1]), torch.tensor([-0.5, -1.0, -1.5]), "serial-1", 1)
    Sizer(cost, together=True).choose(pool, most=4, kv=100, calibrated=True)
    assert calls == [(1, 0, 0.0), (2, 1, 0.0), (3, 2, 0.0), (4, 1, round(math.exp(-1.0) + math.exp(-1.5), 6))]
    calls.clear()
    Sizer(cost).choose(pool, most=3, kv=100, calibrated=True)  # rows one at a time: the rule does not apply
    assert calls[-1] == (3, 0, round(math.exp(-0.5) + math.exp(-1.0), 6))


def test_the_calibration_learns_what_the_target_accepts():
    sizer = Sizer(linear_cost)
    confident = chain_pool([-0.1, -0.2])
    assert sizer.choose(confident, most=3, kv=100)[0] == 3
    for _ in range(30):  # this drafter's confident guesses turn out wrong
        sizer.learn([-0.1, -0.2], [False, False], [1, 2])
    assert sizer.probability(-0.1) < 0.1
    assert sizer.choose(confident, most=3, kv=100) == (1, 0.0)
    for _ in range(120):
        sizer.learn([-0.1], [True], [1])
    assert sizer.probability(-0.1) > 0.6


def test_the_root_s_children_and_deeper_nodes_calibrate_apart():
    """At one score, a deeper node's misses say nothing of a first node's chance, and the other way round."""
    sizer = Sizer(linear_cost)
    for _ in range(40):
        sizer.learn([-1.5, -1.5], [True, False], [1, 3])
    assert sizer.probability(-1.5, 1) > 0.9 and sizer.probability(-1.5, 2) < 0.1
    assert sizer.probability(-1.5, 3) == sizer.probability(-1.5, 2)  # every deeper node shares one table
    assert sizer.could_pay(-1.5, 4, 100)  # its bound takes the likelier of the two
    pool = DraftPool()
    first = pool.add(torch.tensor([5]), torch.tensor([-1]), torch.tensor([-1.5]), "eagle-1", 1)
    pool.add(torch.tensor([6]), first, torch.tensor([-1.5]), "eagle-1", 2)
    assert sizer.choose(pool, most=3, kv=100)[0] == 2  # the first node, not its equally scored child


def test_nodes_left_out_are_learnt_once_the_text_decides_them():
    """A bin the sizer stopped verifying still hears how its nodes fare: `watch` keeps the nodes weighed past the
    tree, `settle` scores each against what was emitted (a path's first differing token decides it wrong, the
    path's last one right), and a bin talked down by early misses comes back once its left-out nodes turn out
    right."""
    sizer = Sizer(linear_cost)
    pool = chain_pool([-0.1, -0.2, -0.3])  # tokens 1, 2, 3 down one chain
    for _ in range(30):
        sizer.learn([-0.1, -0.2, -0.3], [False, False, False], [1, 2, 3])
    assert sizer.choose(pool, most=4, kv=10) == (1, 0.0)
    seen = sum(sizer.calibration.seen)
    sizer.watch(pool, 1, most=4, kv=10)  # the root at position 10: the chain's tokens would sit at 11, 12, 13
    assert [(start, path) for start, path, _ in sizer.pending] == [(11, [1]), (11, [1, 2]), (11, [1, 2, 3])]
    sizer.settle([7, 1], offset=10)  # the root, then token 1: the first node right, the others undecided
    assert len(sizer.pending) == 2 and sum(sizer.calibration.seen) == seen + 1
    sizer.settle([7, 1, 2, 5], offset=10)
    assert not sizer.pending and sum(sizer.calibration.seen) == seen + 3
    assert sum(sizer.calibration.accepted) == 2  # [1] and [1, 2] right, [1, 2, 3] wrong at 5
    sizer.watch(pool, 1, most=4, kv=10)
    sizer.settle([7, 4], offset=10)  # wrong from the first token: all three decided at once
    assert not sizer.pending and sum(sizer.calibration.accepted) == 2
    for _ in range(60):  # the left-out chain is what the target goes on to emit
        sizer.watch(pool, 1, most=4, kv=10)
        sizer.settle([7, 1, 2, 3], offset=10)
    assert sizer.choose(pool, most=4, kv=100)[0] == 4
    sizer.watch(chain_pool([-0.1, -0.2]), 3, most=3, kv=10)  # every weighed node verified: nothing to watch
    assert not sizer.pending


def test_could_pay_bounds_what_choose_takes():
    """Where `could_pay` says no tree whose best node scores s can beat a plain step, `choose` takes n = 1 for
    every pool whose nodes score at most s (random trees, both head-row models, learnt calibrations)."""
    generator = torch.Generator().manual_seed(0)
    checked = 0
    for trial in range(300):
        sizer = Sizer(linear_cost, together=bool(trial % 2))
        for _ in range(trial % 7):
            sizer.learn([-0.2, -1.5], [bool(trial % 3), False], [1, 2])
        # Two chains of three nodes under the root, each node scoring below its parent.
        pool, parents, above = DraftPool(), torch.tensor([-1, -1]), torch.zeros(2)
        for depth in range(1, 4):
            above = above - torch.rand(2, generator=generator) * 2.5
            parents = pool.add(torch.tensor([depth, depth + 8]), parents, above, "eagle-1", depth)
        best = max(x for layer in pool.scores for x in layer.tolist())
        if not sizer.could_pay(best, 7, 100):
            checked += 1
            assert sizer.choose(pool, 7, 100)[0] == 1
    assert checked > 20
    sizer = Sizer(linear_cost)
    assert sizer.could_pay(-0.05, 4, 100) and not sizer.could_pay(-6.0, 4, 100)
    assert not sizer.could_pay(float("-inf"), 8, 100) and not sizer.could_pay(-0.05, 1, 100)


def test_a_recycling_cycle_whose_best_entry_cannot_pay_is_not_drafted(monkeypatch):
    """Token Recycling knows its best candidate before drafting (the root's table row): where even a tree of such
    nodes could not beat a plain step, the cycle is one, and its beam is never run; the output stays AR's."""
    engine = sized_engine(3)
    drafter = engine.drafters["recycle"]
    drafts = []
    original = type(drafter).draft
    monkeypatch.setattr(type(drafter), "draft", lambda self, *a: drafts.append(1) or original(self, *a))
    ids = torch.randint(0, 16, (12,), generator=torch.Generator().manual_seed(3)).tolist() * 2
    tree = replace(TreeSettings.default("recycle", "cpu"), sized=True, lookup_merge=0)  # the table's drafts only
    config = GenerationConfig(max_new_tokens=40, tree=tree)
    ar = engine.generate("", "ar", GenerationConfig(max_new_tokens=40), prompt_ids=ids)
    sized = engine.generate("", "recycle", config, prompt_ids=ids)
    assert sized.token_ids == ar.token_ids and drafts  # drafted where its table had rows
    drafted = len(drafts)
    monkeypatch.setattr(Sizer, "could_pay", lambda self, score, most, kv: False)
    never = engine.generate("", "recycle", config, prompt_ids=ids)
    assert never.token_ids == ar.token_ids and len(drafts) == drafted  # no cycle drafted
    assert all(s.tree_size == 1 and s.expected_accepted == 0.0 for s in never.steps)


def sized_engine(seed: int):
    engine = tiny_engine(seed=seed, vocab=16, drafter_seed=seed)
    curve = [20.0 + 2.0 * n for n in SIZES]
    cost = PathCost(ExecPath("float32"), {kv: curve for kv in KV_LENGTHS}, head_ms=1.0)
    engine.choice = Choice(path=cost.path, methods={}, reason="test", cost=cost)
    return engine


def test_sized_trees_and_the_lookup_switch_keep_greedy_output_exact():
    sizes, lookup_nodes, expectations = set(), 0, 0
    for seed in range(6):
        engine = sized_engine(seed)
        ids = torch.randint(0, 16, (12,), generator=torch.Generator().manual_seed(seed)).tolist() * 2
        ar = engine.generate("", "ar", GenerationConfig(max_new_tokens=40), prompt_ids=ids)
        for method, tree in {
            "gumiho": TreeSettings(top_k=3, depth=5, total_tokens=12, mlptopk=3, pruning=3, sized=True,
                                   lookup_merge=2),
            "eagle2": TreeSettings(top_k=3, depth=4, total_tokens=10, sized=True),
            "eagle2 first level": TreeSettings(top_k=3, depth=4, total_tokens=3, sized=True, first_level=True),
            "gumiho first level": TreeSettings(top_k=2, depth=6, total_tokens=3, mlptopk=6, pruning=6, sized=True,
                                               first_level=True),
            "medusa": replace(TreeSettings.default("medusa", "cpu"), sized=True, lookup_merge=3),
            "lookup": replace(TreeSettings.default("lookup", "cpu"), sized=True),
        }.items():
            run = engine.generate("", method.split()[0], GenerationConfig(max_new_tokens=40, tree=tree), prompt_ids=ids)
            assert run.token_ids == ar.token_ids, (seed, method)
            if tree.first_level:  # the root's candidates only, side by side
                assert all(n.depth <= 1 for s in run.steps for n in s.nodes if n.source != "lookup"), method
            assert run.settings.tree["sized"] is True
            sizes.update(s.tree_size for s in run.steps)
            lookup_nodes += sum(n.source == "lookup" for s in run.steps for n in s.nodes if method != "lookup")
            expectations += sum(s.expected_accepted is not None for s in run.steps if s.tree_size > 1)
    assert 1 in sizes and len(sizes) > 3  # cycles were sized differently, AR steps included
    assert lookup_nodes > 0 and expectations > 0  # the switch happened; sized cycles recorded their expectation


def test_a_fixed_tree_is_not_sized():
    engine = sized_engine(1)
    tree = TreeSettings(top_k=3, depth=4, total_tokens=6)
    run = engine.generate("", "eagle2", GenerationConfig(max_new_tokens=20, tree=tree), prompt_ids=[1, 2, 3])
    assert all(s.expected_accepted is None for s in run.steps)
    assert all(s.tree_size == 6 for s in run.steps[:-1])


def test_a_sized_run_learns_from_the_nodes_it_left_out():
    """In a run the sizer's calibration holds more than the verified nodes: the ones it weighed and left out are
    settled against the emitted text as it grows, and only those whose path runs past the text still wait."""
    engine = sized_engine(2)
    ids = torch.randint(0, 16, (12,), generator=torch.Generator().manual_seed(2)).tolist() * 3
    run = engine.run("", "lookup", GenerationConfig(max_new_tokens=40, tree=replace(
        TreeSettings.default("lookup", "cpu"), sized=True)), prompt_ids=ids)
    steps = list(run)
    verified = sum(s.tree_size - 1 for s in steps)
    assert sum(run.sizer.calibration.seen) > verified
    known = len(ids) + len(run.trace.token_ids)  # the prompt and every emitted token
    assert all(start + len(path) > known for start, path, _ in run.sizer.pending)
