"""Static trees (EAGLE-1, Medusa, Hydra): the official paths, budgets that keep their first entries, drafting."""

from __future__ import annotations

import pytest
import torch

from gumiho.engine import GenerationConfig
from gumiho.errors import GumihoError
from gumiho.static_tree import CHOICES, choices_for, layout
from gumiho.tree import DraftPool, TreeSettings, build_tree

from .conftest import tiny_engine


def test_official_lists_put_every_parent_first():
    assert len(CHOICES["medusa"]) == 63 and len(CHOICES["eagle1"]) == 25
    assert CHOICES["hydra"] == CHOICES["medusa"]
    for paths in CHOICES.values():
        assert len(set(paths)) == len(paths)
        for i, p in enumerate(paths):
            assert len(p) == 1 or paths.index(p[:-1]) < i


def test_layout_keeps_the_first_paths_within_the_depth():
    plan = layout("medusa", 2, 6)
    assert plan.paths == ((0,), (0, 0), (1,), (0, 1), (2,), (1, 0))
    assert plan.parent == (-1, 0, -1, 0, -1, 2)
    assert plan.by_depth == ((0, 2, 4), (1, 3, 5))
    assert plan.top_k == 3 and plan.depth == 2
    assert len(choices_for("medusa", 3)) == 61 and len(choices_for("eagle1", 5)) == 25
    with pytest.raises(GumihoError, match="no static tree"):
        choices_for("eagle2")


def test_priority_decides_what_a_pool_keeps_and_the_order():
    pool = DraftPool()
    first = pool.add(torch.tensor([5, 6]), torch.tensor([-1, -1]), torch.tensor([-2.0, -0.1]), "s", 1,
                     priority=torch.tensor([0.0, -2.0]))
    pool.add(torch.tensor([7]), first[:1], torch.tensor([-3.0]), "s", 2, priority=torch.tensor([-1.0]))
    tree = build_tree(9, pool, 3)
    # Best priorities: token 5 (0), then its child 7 (-1); token 6 scores best but has the lowest priority.
    assert tree.tokens.tolist() == [9, 5, 7] and tree.parents == [-1, 0, 1]


def test_default_static_trees():
    for method, n in (("eagle1", 25), ("medusa", 63), ("hydra", 63)):
        gpu, cpu = TreeSettings.default(method, "cuda"), TreeSettings.default(method, "cpu")
        assert gpu.total_tokens == n + 1 and cpu.total_tokens == 12
        assert gpu.pool_size(method) == n
    assert TreeSettings.default("medusa").depth == 4 and TreeSettings.default("eagle1").depth == 5
    with pytest.raises(GumihoError, match="exceeds"):
        TreeSettings(top_k=4, depth=2, total_tokens=20).validate("eagle1")


@pytest.mark.parametrize("method,depth,total", [("eagle1", 5, 2), ("eagle1", 5, 9), ("eagle1", 5, 26),
                                                ("medusa", 4, 2), ("medusa", 4, 12), ("medusa", 4, 64),
                                                ("hydra", 4, 9), ("hydra", 3, 40)])
def test_static_drafters_draft_the_official_shape(method, depth, total):
    engine = tiny_engine(seed=5, vocab=16, drafter_seed=5)
    tree = TreeSettings(top_k=10, depth=depth, total_tokens=total)
    trace = engine.generate("", method, GenerationConfig(max_new_tokens=12, tree=tree), prompt_ids=[1, 2, 3, 4])
    paths = choices_for(method, depth)[: total - 1]
    source = "eagle" if method == "eagle1" else method
    for step in trace.steps:
        nodes = step.nodes
        assert len(nodes) == total
        # Node i + 1 is path i: same depth, its parent is the path's prefix, and rank r is the r-th best child.
        for i, path in enumerate(paths, start=1):
            node = nodes[i]
            assert node.depth == len(path) and node.source == f"{source}-{len(path)}"
            assert node.parent == (paths.index(path[:-1]) + 1 if len(path) > 1 else 0)
        for i, path in enumerate(paths, start=1):
            if path[-1]:
                brother = paths.index(path[:-1] + (path[-1] - 1,)) + 1
                assert nodes[brother].score >= nodes[i].score
                assert nodes[brother].token_id != nodes[i].token_id
