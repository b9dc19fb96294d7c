"""Prompt lookup's matches as branches of a learned drafter's tree (`lookup_branches`, docs/design.md §17.5): one
pool from two, ranked by calibrated chances; the output stays the target's."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from gumiho.__main__ import main
from gumiho.engine import GenerationConfig
from gumiho.errors import GumihoError
from gumiho.sampling import SamplingConfig
from gumiho.tree import DraftPool, TreeSettings, build_tree, merge_pools

from .conftest import tiny_engine
from .test_mjsd import run_cli
from .test_sizing import sized_engine
from .test_tree import check_invariants


def drafted() -> DraftPool:
    """A drafter's pool: root -> 5 (-0.2), 6 (-1.5); 5 -> 7 (-0.9)."""
    pool, t = DraftPool(), torch.tensor
    pool.add(t([5, 6]), t([-1, -1]), t([-0.2, -1.5]), "serial-1", 1)
    pool.add(t([7]), t([0]), t([-0.9]), "serial-2", 2)
    return pool


def looked_up() -> DraftPool:
    """Prompt lookup's pool: root -> 6 (-0.1) -> 8 (-0.3) -> 9 (-0.6); root -> 5 (-2.0)."""
    pool, t = DraftPool(), torch.tensor
    pool.add(t([6, 5, 8, 9]), t([-1, -1, 0, 2]), t([-0.1, -2.0, -0.3, -0.6]), "lookup", [1, 1, 2, 3])
    return pool


def by_score(kinds: int, own: float, depth: int) -> float:
    """The first source's own exp(score), twice that (at most 1) where both sources drafted the node."""
    return min(1.0, math.exp(own) * (2 if kinds == 3 else 1))


def test_merged_pools_share_agreeing_nodes_and_rank_by_chance():
    merged = merge_pools([drafted(), looked_up()], by_score)
    pool = merged.pool
    tokens, parents = torch.cat(pool.tokens).tolist(), torch.cat(pool.parents).tolist()
    chances = [math.exp(s) for s in torch.cat(pool.scores).tolist()]
    assert tokens == [5, 6, 7, 8, 9]  # depth-major; 5 and 6 drafted by both sources are one node each
    assert parents == [-1, -1, 0, 1, 3]
    assert pool.depths == [1, 1, 2, 2, 3]
    assert pool.sources == ["serial-1", "serial-1", "serial-2", "lookup", "lookup"]
    assert merged.kinds == [3, 3, 1, 2, 2]  # bit k: drafted by input k
    assert merged.own == pytest.approx([-0.2, -1.5, -0.9, -0.3, -0.6])  # the first input's own score
    assert chances[:3] == pytest.approx([1.0, 2 * math.exp(-1.5), math.exp(-0.9)])  # both, both, the drafter's
    # A child is never likelier than its parent, whichever source drafted it: lookup's sure 8 and 9 under 6.
    assert chances[3:] == pytest.approx([2 * math.exp(-1.5)] * 2)
    tree = build_tree(0, pool, 4)
    check_invariants(tree, 4)
    assert tree.tokens.tolist() == [0, 5, 6, 8]  # lookup's 6 -> 8 (agreed 6) outranks the drafter's 5 -> 7
    assert tree.picked == [-1, 0, 1, 3]


def test_a_childs_chance_is_capped_by_its_parents():
    pool, t = DraftPool(), torch.tensor
    pool.add(t([3]), t([-1]), t([-2.0]), "serial-1", 1)
    branch = DraftPool()
    branch.add(t([3, 4]), t([-1, 0]), t([-3.0, -0.1]), "lookup", [1, 2])  # a sure child under an unsure 3
    merged = merge_pools([pool, branch], lambda kinds, own, depth: 0.9 if kinds == 2 else math.exp(own))
    scores = torch.cat(merged.pool.scores).tolist()
    assert scores[1] <= scores[0]
    check_invariants(build_tree(0, merged.pool, 3), 3)


def test_empty_pools_and_static_pools():
    assert merge_pools([DraftPool(), DraftPool()], by_score).pool.size == 0
    assert merge_pools([DraftPool(), looked_up()], by_score).pool.size == 4
    static = DraftPool()
    static.add(torch.tensor([1]), torch.tensor([-1]), torch.tensor([-0.5]), "medusa-1", 1, torch.tensor([1.0]))
    with pytest.raises(ValueError, match="static"):
        merge_pools([static, looked_up()], by_score)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_branches_keep_the_output_the_targets(temperature):
    """Greedy: every method with branches writes AR's tokens. Sampling: the same seed gives the same tokens with
    and without branches only by chance, so it checks the run completes and stays in the vocabulary; losslessness
    is the verifier's (tests/test_sampling.py's chi-square covers trees of any source)."""
    merged_cycles = 0
    for seed in range(4):
        engine = sized_engine(seed)
        ids = torch.randint(0, 16, (10,), generator=torch.Generator().manual_seed(seed)).tolist() * 3
        sampling = SamplingConfig(temperature=temperature)
        ar = engine.generate("", "ar", GenerationConfig(max_new_tokens=40, sampling=sampling), prompt_ids=ids)
        for method, tree in {
            "gumiho": TreeSettings(top_k=3, depth=5, total_tokens=4, mlptopk=3, pruning=3, sized=True,
                                   lookup_merge=3, lookup_branches=1),
            "eagle2": TreeSettings(top_k=2, depth=3, total_tokens=3, sized=True, lookup_branches=1),
        }.items():
            config = GenerationConfig(max_new_tokens=40, tree=tree, sampling=sampling)
            run = engine.generate("", method, config, prompt_ids=ids)
            if temperature == 0:
                assert run.token_ids == ar.token_ids, (seed, method)
            assert all(0 <= token < 16 for token in run.token_ids)
            for step in run.steps:
                sources = {node.source for node in step.nodes[1:]}
                merged_cycles += "lookup" in sources and len(sources) > 1
                # Siblings are distinct tokens, whichever source drafted them.
                kids: dict[int, list[int]] = {}
                for node in step.nodes[1:]:
                    kids.setdefault(node.parent, []).append(node.token_id)
                assert all(len(set(k)) == len(k) for k in kids.values())
                # The trace keeps each node's own score: q is the drafter's probability, none for lookup's nodes.
                for node in step.nodes[1:]:
                    assert (node.q is None) == (node.source == "lookup")
                    assert node.q is None or 0.0 < node.q <= 1.0 + 1e-6
            assert run.settings.tree["lookup_branches"] == 1
    assert merged_cycles > 0  # some cycles verified both sources' candidates in one tree


def test_the_calibration_of_merged_nodes_learns_by_source():
    engine = sized_engine(0)
    ids = list(range(10)) * 3
    tree = TreeSettings(top_k=3, depth=3, total_tokens=4, sized=True, lookup_branches=1)
    run = engine.run("", "eagle2", GenerationConfig(max_new_tokens=30, tree=tree), ids)
    for _ in run:
        pass
    # Lookup alone, the drafter alone and both: each kind of node met has its own calibration, and the verified
    # ones taught theirs.
    assert set(run.calibrations) >= {1, 2}  # the drafter's alone, lookup's alone
    assert sum(sum(fit.seen) for fit in run.calibrations.values()) > 0


def test_a_fixed_tree_keeps_its_size_with_branches():
    """Without per-cycle sizing the branches compete with the drafter's candidates for the tree's fixed size."""
    engine = tiny_engine(seed=3, vocab=16, drafter_seed=3)
    ids = list(range(8)) * 3
    tree = TreeSettings(top_k=3, depth=3, total_tokens=5, lookup_branches=1)
    ar = engine.generate("", "ar", GenerationConfig(max_new_tokens=24), prompt_ids=ids)
    run = engine.generate("", "eagle2", GenerationConfig(max_new_tokens=24, tree=tree), prompt_ids=ids)
    assert run.token_ids == ar.token_ids
    assert all(step.tree_size == 5 for step in run.steps[:-1])
    assert all(step.expected_accepted is None for step in run.steps)
    assert any(node.source == "lookup" for step in run.steps for node in step.nodes)


@pytest.mark.parametrize("method, settings, message", [
    ("eagle2", {"lookup_branches": -1}, "lookup-branches must be >= 0"),
    ("lookup", {"lookup_branches": 1}, "dynamic-tree drafters"),
    ("medusa", {"lookup_branches": 1}, "dynamic-tree drafters"),
    ("mjsd", {"lookup_branches": 1}, "dynamic-tree drafters"),
])
def test_branches_are_a_dynamic_tree_option(method, settings, message):
    with pytest.raises(GumihoError, match=message):
        replace(TreeSettings.default(method, "cpu"), **settings).validate(method)


@pytest.mark.parametrize("args, message", [
    (["--method", "lookup", "--lookup-branches", "1"], "--lookup-branches is an option of the dynamic-tree drafters"),
    (["--method", "medusa", "--lookup-branches", "2"], "--lookup-branches is an option of the dynamic-tree drafters"),
    (["--method", "eagle2", "--lookup-branches", "-1"], "argument --lookup-branches: must be >= 0"),
    (["--method", "gumiho", "--lookup-merge", "x"], "argument --lookup-merge: expected an integer, got 'x'"),
    (["--method", "ar", "--lookup-merge", "3"], "--lookup-merge is an option of the learned drafters"),
    (["--method", "lookup", "--lookup-merge", "2"], "--lookup-merge is an option of the learned drafters and recycle"),
])
def test_bad_branch_options_fail_fast_with_one_line(capsys, args, message):
    code, out, err = run_cli(capsys, *args)
    assert code == 2 and out == ""
    assert err.strip().splitlines() == [err.strip()] and message in err


def test_the_branch_options_reach_the_run(monkeypatch, capsys):
    import json

    from gumiho import loader

    monkeypatch.setattr(loader, "build_engine", lambda *a, **k: tiny_engine())
    assert main(["generate", "--prompt", "w1 w2 w3 w1 w2", "--no-chat", "--method", "eagle2", "--lookup-merge", "0",
                 "--lookup-branches", "1", "--total-tokens", "4", "--max-new-tokens", "6", "--json"]) == 0
    tree = json.loads(capsys.readouterr().out)["settings"]["tree"]
    assert tree["lookup_branches"] == 1 and "lookup_merge" not in tree and tree["total_tokens"] == 4
