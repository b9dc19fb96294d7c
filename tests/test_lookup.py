"""Prompt lookup (`gumiho/drafters/lookup.py`): matches, the trie of continuations and its scores, the drafter's view of
the sequence, exactness on the real model, and the command line's n-gram options."""

from __future__ import annotations

import math
import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest
import torch

from gumiho.__main__ import main
from gumiho.drafters import LookupDrafter, weight_free
from gumiho.drafters.lookup import Match, continues, find_matches, lookup_pool
from gumiho.engine import GenerationConfig
from gumiho.errors import GumihoError
from gumiho.trace import METHODS
from gumiho.tree import TreeSettings, build_tree

from .conftest import tiny_target
from .test_mjsd import run_cli

TREE = TreeSettings.default("lookup", "cpu")


def tree(**changes) -> TreeSettings:
    return replace(TREE, **changes)


def pool_nodes(pool) -> list[tuple[int, int, float, int]]:
    """(token, parent pool index, score, depth) per pool node, in pool order."""
    if not pool.size:
        return []
    tokens, parents, scores = (torch.cat(x).tolist() for x in (pool.tokens, pool.parents, pool.scores))
    return list(zip(tokens, parents, scores, pool.depths))


def assert_scores_fall(pool) -> None:
    nodes = pool_nodes(pool)
    for i, (_, parent, score, depth) in enumerate(nodes):
        assert parent < i and set(pool.sources) == {"lookup"}
        if parent >= 0:
            assert score < nodes[parent][2] and depth == nodes[parent][3] + 1
        else:
            assert score <= 0 and depth == 1


# --- matches ---------------------------------------------------------------------------------------------------------
def test_the_longest_match_comes_first_then_the_most_recent():
    #                   0  1  2  3  4  5  6  7  8  9 10 11 12
    sequence = np.array([1, 2, 3, 9, 5, 2, 3, 7, 6, 3, 4, 1, 2, 3])
    assert find_matches(sequence, 3, 1, 8) == [Match(2, 3), Match(6, 2), Match(9, 1)]
    assert find_matches(sequence, 2, 1, 8) == [Match(6, 2), Match(2, 2), Match(9, 1)]  # equally long: recent first
    assert find_matches(sequence, 3, 2, 8) == [Match(2, 3), Match(6, 2)]  # min_ngram drops the 1-token match
    assert find_matches(sequence, 3, 1, 2) == [Match(2, 3), Match(6, 2)]  # at most `limit`


def test_no_match_and_too_short_sequences():
    assert find_matches(np.array([1, 2, 3, 4, 5]), 3, 1, 8) == []
    assert find_matches(np.array([7]), 3, 1, 8) == []
    assert find_matches(np.array([7, 7]), 3, 1, 8) == [Match(0, 1)]  # the occurrence may touch the suffix
    assert find_matches(np.array([5, 5, 5, 5]), 3, 1, 8) == [Match(2, 3), Match(1, 2), Match(0, 1)]
    assert lookup_pool(np.array([1, 2, 3, 4, 5]), TREE).size == 0
    assert build_tree(5, lookup_pool(np.array([1, 2, 3, 4, 5]), TREE), 8).size == 1  # the cycle is a plain step


# --- the trie ----------------------------------------------------------------------------------------------------------
def test_several_matches_become_branches_merged_where_they_agree():
    # "1 2 3" occurs twice before the suffix, followed by "9 8 5" and "9 8 6"; "2 3" once more, followed by "4".
    sequence = np.array([1, 2, 3, 9, 8, 5, 0, 1, 2, 3, 9, 8, 6, 0, 7, 2, 3, 4, 0, 1, 2, 3])
    pool = lookup_pool(sequence, tree(depth=3))
    nodes = pool_nodes(pool)
    assert [(t, p, d) for t, p, _, d in nodes] == [
        (9, -1, 1), (4, -1, 1),  # depth 1: the two 3-token matches agree on 9; the 2-token match gives 4
        (8, 0, 2), (0, 1, 2),  # 9 -> 8 (both); 4 -> 0
        (6, 2, 3), (5, 2, 3), (1, 3, 3),  # then they part: 6 (the more recent match) and 5; 4 0 -> 1
    ]
    assert_scores_fall(pool)
    scores = [s for _, _, s, _ in nodes]
    assert scores[0] > scores[1] and scores[4] == pytest.approx(scores[5])  # two agreeing matches outweigh one


def test_a_longer_match_outweighs_every_shorter_one_together():
    # The suffix "1 2 3": one earlier 3-token match (-> 9), and four 1-token matches of "3" that all continue with 4.
    sequence = np.array([1, 2, 3, 9, 0, 3, 4, 0, 3, 4, 0, 3, 4, 0, 3, 4, 0, 1, 2, 3])
    pool = lookup_pool(sequence, tree(top_k=5, depth=1))
    assert [(t, d) for t, _, _, d in pool_nodes(pool)] == [(9, 1), (4, 1)]
    built = build_tree(3, pool, 2)  # a budget of one draft token keeps the longest match's
    assert built.tokens.tolist() == [3, 9]


def test_depth_caps_the_continuations_and_scores_fall_along_them():
    sequence = np.array([1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2])
    pool = lookup_pool(sequence, tree(depth=4))
    assert [t for t, *_ in pool_nodes(pool)] == [3, 4, 5, 6]
    assert_scores_fall(pool)
    built = build_tree(2, pool, 3)  # the rerank keeps a tree: the first two of the chain
    assert built.tokens.tolist() == [2, 3, 4] and built.parents == [-1, 0, 1]


def test_a_lone_match_scores_its_prior_chance_token_by_token():
    """One 2-token match: its first token has the prior chance of a 2-token match going on, and each further token
    that of a match one token longer (a right token lengthens the match)."""
    sequence = np.array([1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2])
    scores = [s for _, _, s, _ in pool_nodes(lookup_pool(sequence, tree(depth=3)))]
    chances = [math.exp(s) for s in scores]
    assert chances == pytest.approx([continues(2), continues(2) * continues(3), continues(2) * continues(3) * continues(4)])
    assert continues(1) < 0.25 < continues(2) < continues(3) < continues(4) < 1  # a one-token match is a weak hint


def test_random_sequences_always_give_pools_that_build_into_trees():
    generator = torch.Generator().manual_seed(0)
    for trial in range(200):
        sequence = torch.randint(0, 6, (int(torch.randint(1, 60, (1,), generator=generator)),),
                                 generator=generator).numpy()
        shape = tree(top_k=1 + trial % 6, depth=1 + trial % 7, max_ngram=1 + trial % 4, min_ngram=1)
        pool = lookup_pool(sequence, shape)
        assert pool.size <= shape.pool_size("lookup")
        if pool.size:
            assert_scores_fall(pool)
        for total in (1, 2, 5, 64):
            built = build_tree(int(sequence[-1]), pool, total)
            # Siblings are distinct tokens (the sampling rule needs that) and every path is a real continuation.
            for children in built.children():
                tokens = built.tokens[children].tolist()
                assert len(tokens) == len(set(tokens))


# --- the drafter ---------------------------------------------------------------------------------------------------
def test_the_drafter_sees_the_whole_sequence():
    target = tiny_target()
    drafter = weight_free("lookup", target.model.config)
    assert isinstance(drafter, LookupDrafter) and list(drafter.parameters()) == []
    features = torch.zeros(6, target.hidden_size)
    prompt = torch.tensor([4, 1, 2, 3, 5])
    drafter.reset()
    drafter.observe(prompt, features[:5])  # the prefill
    drafter.observe(torch.tensor([9, 9]), features[:2], torch.zeros(2, 16), [-1, 0])  # a tree: not the sequence
    drafter.propose(features[:5], torch.tensor([1, 2, 3, 5, 1]), TREE)  # pairs: the prompt's tokens 1.., the root
    assert drafter.sequence.tolist() == [4, 1, 2, 3, 5, 1]
    pool = drafter.propose(features[:2], torch.tensor([2, 3]), TREE)  # accepted 2, bonus 3 -> "1 2 3" matches
    assert drafter.sequence.tolist() == [4, 1, 2, 3, 5, 1, 2, 3]
    assert [t for t, *_ in pool_nodes(pool)][:1] == [5]
    drafter.reset()  # a new generation forgets the old text; without a prefill the sequence starts at the pairs
    drafter.propose(features[:3], torch.tensor([7, 8, 7]), TREE)
    assert drafter.sequence.tolist() == [7, 8, 7]


def test_the_drafters_index_of_positions_finds_what_a_scan_of_the_whole_sequence_finds():
    """The drafter looks for matches only where the root's token (or, for matches of three or more, the last three
    tokens) occurred before (its indexes); every cycle's pool equals `lookup_pool` over the whole sequence, node for
    node."""
    target = tiny_target()
    drafter = weight_free("lookup", target.model.config)
    generator = torch.Generator().manual_seed(1)
    features = torch.zeros(8, target.hidden_size)
    for trial in range(40):
        least = 1 + trial % 4
        shape = tree(top_k=1 + trial % 4, depth=2 + trial % 5, max_ngram=least + trial % 2, min_ngram=least)
        drafter.reset()
        drafter.observe(torch.randint(0, 5, (12,), generator=generator), features[:1])
        for _ in range(15):
            accepted = torch.randint(0, 5, (int(torch.randint(1, 4, (1,), generator=generator)),),
                                     generator=generator)
            pool = drafter.propose(features[: len(accepted)], accepted, shape)
            assert pool_nodes(pool) == pool_nodes(lookup_pool(drafter.sequence.copy(), shape))


def test_lookup_settings_are_checked():
    assert TREE.max_ngram == 3 and TREE.min_ngram == 1 and TREE.total_tokens <= 8
    TREE.validate("lookup")
    with pytest.raises(GumihoError, match="min-ngram <= max-ngram"):
        tree(min_ngram=3, max_ngram=2).validate("lookup")
    with pytest.raises(GumihoError, match="min-ngram <= max-ngram"):
        tree(min_ngram=0).validate("lookup")
    with pytest.raises(GumihoError, match="lookup options"):
        replace(TreeSettings.default("eagle2"), max_ngram=2).validate("eagle2")
    with pytest.raises(GumihoError, match="exceeds the 24 candidates"):
        tree(total_tokens=26).validate("lookup")
    assert "max_ngram" not in TreeSettings.default("eagle2").to_dict()  # other methods' trees read as before
    assert TreeSettings(**TREE.to_dict()) == TREE


# --- the real model --------------------------------------------------------------------------------------------------
REPEATING = ("Copy this list exactly, twice, one item per line:\napple pie\nbanana bread\ncherry tart\n"
             "date cake\napple pie\nbanana bread\ncherry tart\ndate cake")


@pytest.mark.slow
def test_greedy_lookup_equals_ar_on_the_default_model(smollm):
    config = GenerationConfig(max_new_tokens=24)
    ar = smollm.generate(REPEATING, "ar", config)
    run = smollm.generate(REPEATING, "lookup", config)
    assert run.token_ids == ar.token_ids
    assert sum(step.accept_length for step in run.steps) >= 3, "the repeating prompt must get drafts accepted"
    assert run.cycles < ar.cycles and run.drafter == ""
    assert {n.source for s in run.steps for n in s.nodes} == {"root", "lookup"}
    assert all(s.tree_size <= run.settings.tree["total_tokens"] for s in run.steps)


# --- the command line ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("args,message", [
    (["--method", "lookup", "--max-ngram", "-1"], "argument --max-ngram: must be >= 1"),
    (["--method", "lookup", "--min-ngram", "-2"], "argument --min-ngram: must be >= 1"),
    (["--method", "lookup", "--max-ngram", "0"], "argument --max-ngram: must be >= 1"),
    (["--method", "lookup", "--max-ngram", "three"], "expected an integer, got 'three'"),
    (["--method", "lookup", "--min-ngram", "1.5"], "expected an integer, got '1.5'"),
    (["--method", "lookup", "--min-ngram", "3", "--max-ngram", "2"], "--min-ngram (3) must not exceed --max-ngram (2)"),
    (["--method", "lookup", "--min-ngram", "4"], "--min-ngram (4) must not exceed --max-ngram (3)"),
    (["--method", "eagle2", "--max-ngram", "2"], "--max-ngram and --min-ngram are lookup options"),
    (["--method", "recycle", "--min-ngram", "2"], "--max-ngram and --min-ngram are lookup options"),
    (["--method", "lookup", "--drafter", "assets/drafters/smollm2-135m-eagle2"], "lookup drafts without weights"),
    *[(["--method", m, "--total-tokens", "0"], "--total-tokens must be >= 1 or 'auto'") for m in METHODS],
    (["--method", "lookup", "--total-tokens", "-3"], "--total-tokens must be >= 1 or 'auto'"),
    (["--method", "lookup", "--first-level"], "a first-level tree is an option of the dynamic-tree drafters"),
])
def test_bad_lookup_options_fail_fast_with_one_line(capsys, args, message):
    code, out, err = run_cli(capsys, *args)
    assert code == 2 and out == ""
    assert err.strip().splitlines() == [err.strip()] and message in err


@pytest.mark.parametrize("args,message", [
    (["--method", "lookup", "--drafter", "some/folder"], "error: lookup drafts without weights"),
    (["--method", "lookup", "--max-ngram", "-1"], "argument --max-ngram: must be >= 1"),
    (["--method", "lookup", "--min-ngram", "3", "--max-ngram", "1"], "must not exceed --max-ngram (1)"),
    (["--method", "ar", "--total-tokens", "0"], "error: --total-tokens must be >= 1 or 'auto'"),
])
def test_bad_lookup_options_from_a_real_process(args, message):
    proc = subprocess.run([sys.executable, "-m", "gumiho", "generate", "--prompt", "hi", *args],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and proc.stdout == ""
    assert len(proc.stderr.strip().splitlines()) == 1 and message in proc.stderr


def test_the_app_caps_a_draft_free_tree_at_what_its_shape_drafts():
    from app.service import RunSettings, race_settings

    for method, largest in (("lookup", 4 * 6 + 1), ("recycle", 4 + 4 * 4**2 + 1)):
        base = TreeSettings.default(method, "cpu")
        assert RunSettings(total_tokens=64).config(method, base).tree.total_tokens == min(64, largest)
        assert RunSettings(total_tokens=6, top_k=2).config(method, base).tree.total_tokens == 6
    race = race_settings(RunSettings(total_tokens=16, top_k=3), ["gumiho", "lookup", "recycle"])
    assert list(race) == ["gumiho", "lookup", "recycle", "ar"]
    assert race["lookup"].config("lookup", TREE).tree == tree(top_k=3, total_tokens=16)


def test_the_ngram_options_reach_the_run(monkeypatch, capsys):
    import json

    from gumiho import loader

    from .conftest import tiny_engine

    monkeypatch.setattr(loader, "build_engine", lambda *a, **k: tiny_engine())
    assert main(["generate", "--prompt", "w1 w2 w3 w1 w2", "--no-chat", "--method", "lookup", "--max-ngram", "2",
                 "--min-ngram", "2", "--tree-top-k", "2", "--max-new-tokens", "6", "--json", "--trace"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["method"] == "lookup" and record["drafter"] == ""
    assert record["settings"]["tree"] == {**TREE.to_dict(), "top_k": 2, "max_ngram": 2, "min_ngram": 2}
    assert main(["generate", "--prompt", "w1 w2", "--method", "recycle", "--max-new-tokens", "4", "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["settings"]["tree"] == TreeSettings.default("recycle", "cpu").to_dict()
