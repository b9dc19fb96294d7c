"""Tree invariants, on pools drafted by real (random-weight) drafters and on a hand-made pool."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from gumiho.errors import GumihoError
from gumiho.tree import LOOKUP_BRANCHES, LOOKUP_MERGE, DraftPool, TreeSettings, build_tree

from .conftest import tiny_engine


def hand_pool() -> DraftPool:
    """root -> a(-0.1), b(-0.5); a -> c(-0.2), d(-1.0); c -> e(-0.3); b -> f(-0.6)."""
    pool = DraftPool()
    t = torch.tensor
    pool.add(t([10, 11]), t([-1, -1]), t([-0.1, -0.5]), "serial-1", 1)
    pool.add(t([12, 13, 15]), t([0, 0, 1]), t([-0.2, -1.0, -0.6]), "serial-2", 2)
    pool.add(t([14]), t([2]), t([-0.3]), "mlp-3", 3)
    return pool


def ancestors(parents: list[int], node: int) -> set[int]:
    out = set()
    while node >= 0:
        out.add(node)
        node = parents[node]
    return out


def check_invariants(tree, total_tokens: int) -> None:
    n = tree.size
    assert n <= total_tokens
    assert tree.parents[0] == -1 and tree.depths[0] == 0
    for i in range(1, n):
        p = tree.parents[i]
        assert 0 <= p < i, "parent must be in the tree and come first"
        assert tree.depths[i] == tree.depths[p] + 1, "parent must be one level shallower"
        assert tree.scores[i] <= tree.scores[p] + 1e-6, "cumulative log-prob never rises along a path"
    for i in range(n):
        expected = ancestors(tree.parents, i)
        assert set(torch.nonzero(tree.mask[i]).flatten().tolist()) == expected, "mask row = ancestors + self"
    assert tree.position_ids.tolist() == tree.depths
    leaves = {i for i in range(n) if i not in tree.parents}
    seen_leaves = set()
    for row in tree.paths.tolist():
        nodes = [x for x in row if x >= 0]
        assert row[len(nodes):] == [-1] * (len(row) - len(nodes)), "padding only at the end"
        assert nodes[0] == 0
        for a, b in zip(nodes, nodes[1:]):
            assert tree.parents[b] == a, "a path follows parent links"
        seen_leaves.add(nodes[-1])
    assert seen_leaves == leaves, "one path per leaf"


def test_hand_pool_rerank_keeps_best_nodes():
    tree = build_tree(7, hand_pool(), total_tokens=5)
    # best 4 scores: a(-0.1), c(-0.2), e(-0.3), b(-0.5); kept in pool order a, b, c, e
    assert tree.tokens.tolist() == [7, 10, 11, 12, 14]
    assert tree.parents == [-1, 0, 0, 1, 3]
    assert tree.sources == ["root", "serial-1", "serial-1", "serial-2", "mlp-3"]
    assert tree.paths.tolist() == [[0, 2, -1, -1], [0, 1, 3, 4]]
    check_invariants(tree, 5)


def test_ties_prefer_the_ancestor():
    pool = DraftPool()
    t = torch.tensor
    pool.add(t([1, 2]), t([-1, -1]), t([-1.0, -1.0]), "eagle-1", 1)
    pool.add(t([3]), t([1]), t([-1.0]), "eagle-2", 2)  # child of the second node, same score
    tree = build_tree(0, pool, total_tokens=2)
    assert tree.tokens.tolist() == [0, 1]
    tree = build_tree(0, pool, total_tokens=3)
    assert tree.tokens.tolist() == [0, 1, 2]


def test_root_only_tree():
    tree = build_tree(5, DraftPool(), 1)
    assert tree.size == 1 and tree.paths.tolist() == [[0]] and tree.mask.tolist() == [[True]]
    # AR's tree has no drafted tensor to take a device from: it goes where the target is ("meta" stands in for CUDA).
    meta = build_tree(5, DraftPool(), 1, torch.device("meta"))
    assert {t.device.type for t in (meta.tokens, meta.position_ids, meta.mask, meta.paths)} == {"meta"}


@pytest.mark.parametrize("method", ["eagle2", "gumiho"])
@pytest.mark.parametrize("seed", range(4))
def test_drafted_trees_satisfy_invariants(method, seed):
    engine = tiny_engine(seed=seed, vocab=32, drafter_seed=seed)
    drafter = engine.drafters[method]
    drafter.reset()
    features = torch.randn(6, 32)
    tokens = torch.randint(0, 32, (6,))
    for total, tree_settings in [
        (8, TreeSettings(top_k=3, depth=4, total_tokens=8, mlptopk=3, pruning=3)),
        (20, TreeSettings(top_k=4, depth=6, total_tokens=20, mlptopk=5, pruning=6)),
        (33, TreeSettings(top_k=5, depth=5, total_tokens=33, mlptopk=6, pruning=7)),
    ]:
        tree_settings.validate(method)
        pool = drafter.propose(features, tokens, tree_settings)
        assert drafter.cache.length == 6, "expansion KV is dropped after drafting"
        assert pool.size == tree_settings.pool_size(method), "validate() knows how many candidates there will be"
        tree = build_tree(int(tokens[-1]), pool, total)
        assert tree.size == total
        check_invariants(tree, total)
        depth_limit = tree_settings.depth + 1
        assert max(tree.depths) <= depth_limit
        if method == "gumiho":
            for node, d in zip(tree.sources[1:], tree.depths[1:]):
                assert node == ("serial-1" if d == 1 else "serial-2" if d == 2 else f"mlp-{d}")
        drafter.reset()


@pytest.mark.parametrize("method", ["eagle2", "gumiho"])
@pytest.mark.parametrize("top_k", [1, 2, 3])
def test_a_small_tree_drafts_only_as_deep_as_it_can_keep(method, top_k):
    """A tree of n tokens drafts n - 2 expansion steps at most, and keeps exactly the nodes the full draft's tree
    of n tokens keeps (a node never ranks above its parent)."""
    engine = tiny_engine(seed=top_k, vocab=32, drafter_seed=top_k)
    drafter = engine.drafters[method]
    features, tokens = torch.randn(6, 32), torch.randint(0, 32, (6,))
    wide = TreeSettings(top_k=top_k, depth=5, total_tokens=64, mlptopk=3, pruning=3)
    drafter.reset()
    full = drafter.propose(features, tokens, wide)
    for n in range(2, 9):
        small = replace(wide, total_tokens=n)
        assert small.drafted_depth == min(5, n - 2)
        assert replace(small, fta=True).drafted_depth == 5, "FTA pads with deeper tokens: it keeps every step"
        drafter.reset()
        pool = drafter.propose(features, tokens, small)
        assert max(pool.depths) == small.drafted_depth + 1
        got, want = build_tree(int(tokens[-1]), pool, n), build_tree(int(tokens[-1]), full, n)
        assert (got.tokens.tolist(), got.parents, got.sources) == (want.tokens.tolist(), want.parents, want.sources)


@pytest.mark.parametrize("method", ["eagle2", "gumiho"])
def test_a_first_level_tree_drafts_the_roots_candidates_only(method):
    """A first-level tree of n tokens keeps the root's best n - 1 candidates side by side, drafted as a 2-token
    tree's draft is (no expansion step)."""
    engine = tiny_engine(seed=5, vocab=32, drafter_seed=5)
    drafter = engine.drafters[method]
    features, tokens = torch.randn(6, 32), torch.randint(0, 32, (6,))
    tree = TreeSettings(top_k=3, depth=6, total_tokens=4, mlptopk=3, pruning=3, first_level=True)
    assert tree.drafted_depth == 0 and tree.pool_size(method) == 3
    tree.validate(method)
    drafter.reset()
    pool = drafter.propose(features, tokens, tree)
    drafter.reset()
    two = drafter.propose(features, tokens, replace(tree, total_tokens=2, first_level=False))
    assert pool.depths == [1, 1, 1] and torch.equal(torch.cat(pool.tokens), torch.cat(two.tokens))
    built = build_tree(int(tokens[-1]), pool, tree.total_tokens)
    assert built.parents == [-1, 0, 0, 0]
    assert "first_level" in tree.to_dict() and "first_level" not in replace(tree, first_level=False).to_dict()


def test_fta_fills_short_paths_with_the_most_travelled_node():
    tree = build_tree(7, hand_pool(), total_tokens=7)
    # nodes: 0 root, 1 a, 2 b, 3 c, 4 d, 5 f, 6 e ; paths: [0,2,5,-1] [0,1,4,-1] [0,1,3,6]
    assert tree.paths.tolist() == [[0, 1, 4, -1], [0, 2, 5, -1], [0, 1, 3, 6]]
    fta = tree.with_fta()
    assert fta.paths.tolist() == [[0, 1, 4, 6], [0, 2, 5, 6], [0, 1, 3, 6]]
    assert fta.filled.tolist() == [[False, False, False, True], [False, False, False, True], [False] * 4]
    assert bool(fta.mask[4, 6]) and bool(fta.mask[5, 6]), "short leaves attend to the borrowed node"
    changed = (fta.mask != tree.mask).nonzero().tolist()
    assert sorted(changed) == [[4, 6], [5, 6]], "nothing else in the mask changes"
    assert not tree.filled.any(), "the original tree is untouched"


@pytest.mark.parametrize("method,settings,message", [
    ("eagle2", TreeSettings(top_k=2, depth=2, total_tokens=20), "exceeds"),
    ("gumiho", TreeSettings(top_k=2, depth=1, total_tokens=4, mlptopk=2, pruning=2), "depth >= 2"),
    ("gumiho", TreeSettings(top_k=0, depth=6, total_tokens=4, mlptopk=2, pruning=2), ">= 1"),
    # 2 serial nodes, then MLP beams of 2, 4, 8, 10, 10: 36 candidates, not 2 + 5 x 10
    ("gumiho", TreeSettings(top_k=1, depth=6, total_tokens=40, mlptopk=2, pruning=10), "exceeds the 36 candidates"),
    ("eagle2", TreeSettings(top_k=2, depth=2, total_tokens=4, fta=True), "FTA .* is a Gumiho option"),
    ("eagle2", TreeSettings(top_k=2, depth=2, total_tokens=4, first_level=True), "exceeds the 2 candidates"),
    ("lookup", TreeSettings(top_k=4, depth=6, total_tokens=3, max_ngram=3, min_ngram=1, first_level=True),
     "first-level tree .* not of lookup"),
    ("gumiho", TreeSettings(top_k=2, depth=6, total_tokens=3, mlptopk=6, pruning=6, fta=True, first_level=True),
     "not of an FTA tree"),
])
def test_bad_tree_settings(method, settings, message):
    from gumiho.errors import GumihoError

    with pytest.raises(GumihoError, match=message):
        settings.validate(method)


def test_a_tree_deeper_than_the_drafters_heads_is_refused_before_the_run():
    from gumiho.engine import GenerationConfig
    from gumiho.errors import GumihoError

    engine = tiny_engine()
    deep = TreeSettings(top_k=2, depth=7, total_tokens=8, mlptopk=2, pruning=2)  # 2 serial + 6 heads; it has 5
    with pytest.raises(GumihoError, match="depth 7 needs 6 MLP heads; this drafter has 5"):
        engine.run("", "gumiho", GenerationConfig(tree=deep), prompt_ids=[1, 2, 3])


@pytest.mark.parametrize("method", ["eagle2", "gumiho"])
@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_resolve_without_overrides_is_the_device_default(method, device):
    assert TreeSettings.resolve(method, device) == TreeSettings.default(method, device)
    assert TreeSettings.resolve(method, device, {}) == TreeSettings.default(method, device)
    assert TreeSettings.resolve(method, device, {"top_k": None, "fta": None}) == TreeSettings.default(method, device)


def test_resolve_applies_the_overrides_given_and_keeps_the_rest():
    cpu, gpu = TreeSettings.default("gumiho", "cpu"), TreeSettings.default("gumiho", "cuda")
    assert (cpu.top_k, gpu.top_k) == (4, 14)  # the defaults differ per device
    tree = TreeSettings.resolve("gumiho", "cuda", {"total_tokens": 24, "fta": False, "depth": None})
    assert tree == TreeSettings(top_k=14, depth=6, total_tokens=24, mlptopk=35, pruning=35, fta=False,
                                lookup_merge=LOOKUP_MERGE, lookup_branches=LOOKUP_BRANCHES)
    assert TreeSettings.resolve("eagle2", "cpu", {"top_k": 3, "mlp_parent_align": False}) == TreeSettings(
        top_k=3, depth=5, total_tokens=12, mlp_parent_align=False, lookup_merge=LOOKUP_MERGE,
        lookup_branches=LOOKUP_BRANCHES)


def test_a_fixed_size_switches_per_cycle_sizing_off():
    sized = replace(TreeSettings.default("gumiho", "cpu"), sized=True, lookup_branches=0)
    assert TreeSettings.resolve("gumiho", "cpu", {"top_k": 3}, base=sized).sized
    assert not TreeSettings.resolve("gumiho", "cpu", {"total_tokens": 6}, base=sized).sized
    first_level = replace(sized, total_tokens=3, top_k=2, first_level=True)
    assert TreeSettings.resolve("gumiho", "cpu", {"top_k": 3}, base=first_level).first_level
    fixed = TreeSettings.resolve("gumiho", "cpu", {"total_tokens": 6}, base=first_level)
    assert not fixed.first_level and fixed.drafted_depth == 4  # a fixed size drafts the method's own shape


def test_lookup_branches_by_default_in_fixed_dynamic_trees_only():
    """Branches pay where the tree's size is fixed (design.md §17.5): the dynamic trees' default on every device,
    and a size fixed over the automatic, sized tree (which goes without) takes them back unless told otherwise."""
    for device in ("cpu", "cuda"):
        assert TreeSettings.default("eagle2", device).lookup_branches == LOOKUP_BRANCHES
        assert TreeSettings.default("gumiho", device).lookup_branches == LOOKUP_BRANCHES
        for method in ("eagle1", "medusa", "hydra", "mjsd", "lookup", "recycle"):
            assert TreeSettings.default(method, device).lookup_branches == 0
    sized = replace(TreeSettings.default("gumiho", "cpu"), sized=True, lookup_branches=0)
    assert TreeSettings.resolve("gumiho", "cpu", {"top_k": 3}, base=sized).lookup_branches == 0
    assert TreeSettings.resolve("gumiho", "cpu", {"total_tokens": 6}, base=sized).lookup_branches == LOOKUP_BRANCHES
    fixed = TreeSettings.resolve("gumiho", "cpu", {"total_tokens": 6, "lookup_branches": 0}, base=sized)
    assert fixed.lookup_branches == 0


@pytest.mark.parametrize("method", ["eagle2", "gumiho"])
def test_a_size_beyond_a_narrow_automatic_tree_takes_the_default_shape(method):
    """Where drafting is dear the automatic tree keeps one token a step (top_k 1): asking for 12 tokens (the
    app's race budget, `--total-tokens 12`) then takes the method's default shape, not an error; an explicit top_k
    that cannot draft them still is one."""
    fta = method == "gumiho"  # the automatic FTA setting is kept
    narrow = replace(TreeSettings.default(method, "cpu"), top_k=1, mlptopk=1, pruning=1, total_tokens=2, sized=True,
                     fta=fta)
    tree = TreeSettings.resolve(method, "cpu", {"total_tokens": 12}, base=narrow)
    default = TreeSettings.default(method, "cpu")
    assert (tree.top_k, tree.total_tokens, tree.sized, tree.fta) == (default.top_k, 12, False, fta)
    assert TreeSettings.resolve(method, "cpu", {"total_tokens": 2}, base=narrow).top_k == 1  # it fits: kept
    with pytest.raises(GumihoError, match="exceeds"):
        TreeSettings.resolve(method, "cpu", {"total_tokens": 12, "top_k": 1}, base=narrow)


def test_the_lookup_switch_verifies_lookups_budget_unless_the_tree_size_is_fixed():
    """The automatic CPU choice sizes Gumiho's cycles up to 2 tokens: its switch to prompt lookup keeps lookup's own
    budget (8), so a long match can be verified; a fixed size stays the most a cycle verifies."""
    lookup = TreeSettings.default("lookup", "cpu")
    base = replace(TreeSettings.default("gumiho", "cpu"), lookup_merge=LOOKUP_MERGE)
    sized = replace(base, total_tokens=2, sized=True).lookup_tree()
    assert (sized.total_tokens, sized.min_ngram, sized.depth) == (lookup.total_tokens, LOOKUP_MERGE, lookup.depth)
    assert replace(base, total_tokens=1).lookup_tree().total_tokens == lookup.total_tokens  # the root alone
    assert replace(base, total_tokens=2).lookup_tree().total_tokens == 2


@pytest.mark.parametrize("method,merge", [("gumiho", -1), ("mjsd", 3), ("lookup", 3), ("recycle", -1)])
def test_the_lookup_switch_is_a_learned_drafters_and_recyclings_option(method, merge):
    with pytest.raises(GumihoError, match="lookup-merge"):
        replace(TreeSettings.default(method, "cpu"), lookup_merge=merge).validate(method)


def test_recycling_switches_to_prompt_lookup_on_a_cpu_only():
    """Measured to pay on a CPU (tree.py, beside LOOKUP_MERGE); a GPU's nearly free 64-token trees keep the table's."""
    assert TreeSettings.default("recycle", "cpu").lookup_merge == LOOKUP_MERGE
    assert TreeSettings.default("recycle", "cuda").lookup_merge == 0
    TreeSettings.default("recycle", "cpu").validate("recycle")


def test_resolve_gives_no_tree_for_ar():
    assert TreeSettings.resolve("ar", "cpu") is None
    assert TreeSettings.resolve("ar", "cuda", {"total_tokens": 0, "fta": True}) is None  # nothing to check either


@pytest.mark.parametrize("method,overrides,message", [
    ("eagle2", {"total_tokens": 0}, ">= 1"),
    ("eagle2", {"top_k": 2, "depth": 2, "total_tokens": 20}, "exceeds"),
    ("eagle2", {"fta": True}, "FTA .* is a Gumiho option"),
    ("gumiho", {"depth": 1}, "depth >= 2"),
    ("gumiho", {"total_tokens": 64}, "exceeds the 38 candidates"),  # the CPU default: 2 x 4 + 5 x 6
    ("gumiho", {"total_tokens": 6, "first_level": True}, "exceeds the 4 candidates"),  # the root's top_k
    ("recycle", {"first_level": True}, "first-level tree is an option of the dynamic-tree drafters"),
])
def test_resolve_refuses_a_tree_the_method_cannot_draft(method, overrides, message):
    from gumiho.errors import GumihoError

    with pytest.raises(GumihoError, match=message):
        TreeSettings.resolve(method, "cpu", overrides)
