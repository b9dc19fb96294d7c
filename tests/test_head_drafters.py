"""Medusa and Hydra: heads on the target's last feature, drafting their static tree."""

from __future__ import annotations

import pytest
import torch

from gumiho.drafters import Drafter, DrafterConfig, HeadDrafter, new_drafter
from gumiho.drafters.checkpoint import load_drafter
from gumiho.errors import GumihoError
from gumiho.export import check_format
from gumiho.static_tree import choices_for
from gumiho.tree import TreeSettings, build_tree

from .conftest import random_drafter, tiny_target

HEADS = ["medusa", "hydra"]
FULL_TREE = TreeSettings(top_k=10, depth=4, total_tokens=64)


def _context(target, length: int = 7, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Accepted pairs (f_j, x_{j+1}) of a random prompt; the last token is the root."""
    ids = torch.randint(0, target.vocab_size, (length + 1,), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        features = target.model.model(input_ids=ids[None]).last_hidden_state[0]
    return features[:-1], ids[1:]


@pytest.fixture(scope="module")
def target():
    return tiny_target(seed=3, vocab=16)


def test_shapes_for_a_target():
    config = tiny_target().model.config
    for kind in HEADS:
        shape = DrafterConfig.for_target(kind, config)
        assert (shape.num_layers, shape.mlp_heads, shape.mlp_blocks) == (0, 4, 1)
    assert DrafterConfig.for_target("gumiho", config).num_layers == 2
    with pytest.raises(GumihoError, match="unknown drafter kind 'beam'"):
        DrafterConfig.for_target("beam", config)


@pytest.mark.parametrize("kind", HEADS)
def test_no_draft_transformer_and_nothing_kept_between_cycles(target, kind):
    drafter = random_drafter(kind, target).attach(target.embed_weight, target.head_weight)
    assert isinstance(drafter, HeadDrafter) and not hasattr(drafter, "transformer") and not hasattr(drafter, "cache")
    assert all(name.startswith("heads.") for name in drafter.state_dict())
    features, tokens = _context(target)
    first = build_tree(int(tokens[-1]), drafter.propose(features, tokens, FULL_TREE), 64)
    drafter.propose(features[:3], tokens[:3], FULL_TREE)  # another context in between changes nothing
    again = build_tree(int(tokens[-1]), drafter.propose(features[-1:], tokens[-1:], FULL_TREE), 64)
    assert torch.equal(first.tokens, again.tokens) and first.scores == again.scores


@pytest.mark.parametrize("kind", HEADS)
def test_every_node_is_its_heads_ranked_candidate(target, kind):
    """Node (..., r) at depth d is the r-th best token of head d - 1 fed f_j, the root and the node's own path
    above it; its score is its parent's plus that token's log-prob."""
    drafter = random_drafter(kind, target).attach(target.embed_weight, target.head_weight)
    features, tokens = _context(target, seed=1)
    tree = build_tree(int(tokens[-1]), drafter.propose(features, tokens, FULL_TREE), 64)
    paths = choices_for(kind, 4)
    node = {p: i + 1 for i, p in enumerate(paths)}
    with torch.no_grad():
        for path, i in node.items():
            above = [int(tree.tokens[node[path[:d]]]) for d in range(1, len(path))]
            following = torch.tensor([[int(tokens[-1]), *above]])
            values, ids = drafter.top_tokens(drafter.predict(features[-1:], following, len(path) - 1), 10)
            assert int(tree.tokens[i]) == int(ids[0, path[-1]])
            parent_score = tree.scores[node[path[:-1]]] if len(path) > 1 else 0.0
            assert tree.scores[i] == pytest.approx(parent_score + float(values[0, path[-1]]), abs=1e-5)


def test_hydras_heads_read_the_earlier_draft_tokens_and_medusas_do_not(target):
    features, tokens = _context(target, seed=2)
    f, root = features[-1:], int(tokens[-1])
    outputs = {}
    with torch.no_grad():
        for kind in HEADS:
            drafter = random_drafter(kind, target).attach(target.embed_weight, target.head_weight)
            outputs[kind] = [drafter.predict(f, torch.tensor([[root, d1]]), 1) for d1 in (3, 11)]
    assert torch.equal(*outputs["medusa"])
    assert not torch.allclose(*outputs["hydra"])
    # In the drafted trees: under every depth-1 node, Medusa's depth-2 candidates are the same tokens with the same
    # log-probs; Hydra's are not.
    paths = choices_for("medusa", 4)
    children = {}
    for kind in HEADS:
        drafter = random_drafter(kind, target).attach(target.embed_weight, target.head_weight)
        tree = build_tree(root, drafter.propose(features, tokens, FULL_TREE), 64)
        under = {}
        for i, path in enumerate(paths, start=1):
            if len(path) == 2 and path[1] == 0:
                under[path[0]] = (int(tree.tokens[i]), round(tree.scores[i] - tree.scores[tree.parents[i]], 5))
        children[kind] = {under[p] for p in range(3)}
    assert len(children["medusa"]) == 1 and len(children["hydra"]) == 3


def test_hydra_blocks_after_the_first_have_their_own_weights(target, tmp_path):
    drafter = new_drafter("hydra", target.model.config, mlp_blocks=3)
    h = target.hidden_size
    assert drafter.heads.rest.block_weight.shape == (4, 2, h, h)
    assert [layer.in_features for layer in drafter.heads.first] == [2 * h, 3 * h, 4 * h, 5 * h]
    with torch.no_grad():
        drafter.heads.rest.block_weight[:, 0] = 1.0
    drafter.save_pretrained(tmp_path / "d")
    loaded = Drafter.from_pretrained(tmp_path / "d")
    assert torch.equal(loaded.heads.rest.block_weight, drafter.heads.rest.block_weight)
    assert not loaded.heads.rest.block_weight[:, 1].any()


@pytest.mark.parametrize("kind", HEADS)
def test_grown_heads_draft_as_before_and_train_their_new_blocks(target, tmp_path, kind):
    drafter = random_drafter(kind, target).attach(target.embed_weight, target.head_weight)
    grown = drafter.grown(3).attach(target.embed_weight, target.head_weight)
    assert grown.config.mlp_blocks == 3 and drafter.config.mlp_blocks == 1
    features, tokens = _context(target)
    before, after = (build_tree(int(tokens[-1]), d.propose(features, tokens, FULL_TREE), 64) for d in (drafter, grown))
    assert torch.equal(before.tokens, after.tokens) and before.scores == pytest.approx(after.scores, abs=1e-5)
    grown.save_pretrained(tmp_path / "d")
    assert Drafter.from_pretrained(tmp_path / "d").config.mlp_blocks == 3
    following = tokens[-1:].expand(1, 2)
    loss = grown.predict(features[-1:], following, 1).square().sum()
    loss.backward()
    new_block = grown.heads.block_weight if kind == "medusa" else grown.heads.rest.block_weight
    assert new_block.grad[:, -1].abs().sum() > 0  # the identity blocks are not stuck at zero
    with pytest.raises(GumihoError, match="it can grow, not shrink"):
        grown.grown(2)


def test_blocks_apply_to_head_drafters_only():
    from gumiho.train.trainer import check_kind

    check_kind("medusa", 2)
    with pytest.raises(GumihoError, match="--blocks applies to medusa and hydra, not gumiho"):
        check_kind("gumiho", 2)


@pytest.mark.parametrize("kind,other", [("medusa", "hydra"), ("hydra", "medusa"), ("medusa", "eagle2"),
                                        ("gumiho", "hydra")])
def test_a_folder_of_another_kind_is_refused_in_one_line(target, tmp_path, kind, other):
    random_drafter(kind, target).save_pretrained(tmp_path / kind)
    with pytest.raises(GumihoError) as error:
        load_drafter(str(tmp_path / kind), other, target.embed_weight, target.model.config)
    assert str(error.value) == f"{tmp_path / kind} is a {kind} drafter; it cannot serve method {other}"


def test_trees_the_heads_cannot_draft_are_refused(target):
    few = new_drafter("medusa", target.model.config, mlp_heads=2)
    few.check_tree(TreeSettings(top_k=10, depth=2, total_tokens=12))
    with pytest.raises(GumihoError, match="depth 3 needs 3 heads; this drafter has 2"):
        few.check_tree(TreeSettings(top_k=10, depth=4, total_tokens=12))
    narrow = new_drafter("hydra", tiny_target(vocab=8).model.config)
    narrow.check_tree(TreeSettings(top_k=10, depth=4, total_tokens=12))  # its first 11 paths: ranks 0..4
    with pytest.raises(GumihoError, match="top 10 tokens; the drafter proposes from 8"):
        narrow.check_tree(FULL_TREE)


@pytest.mark.parametrize("kind", HEADS)
def test_export_has_no_format_for_head_drafters(kind):
    with pytest.raises(GumihoError, match=f"a {kind} drafter has no official format"):
        check_format(kind, "official")
