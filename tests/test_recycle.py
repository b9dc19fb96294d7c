"""Token Recycling (`gumiho/drafters/recycle.py`): the table and how it fills from the target's logits, the tree drafted
from it, the engine's `observe` hook, exactness on the real model, and bad input on the command line."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from gumiho.__main__ import main
from gumiho.drafters import Drafter, RecycleDrafter, weight_free
from gumiho.drafters import recycle as recycle_module
from gumiho.engine import Engine, GenerationConfig
from gumiho.errors import GumihoError
from gumiho.tree import RECYCLE_WIDTH, TreeSettings, build_tree

from .conftest import tiny_engine, tiny_target

VOCAB = 16


def drafter(hot_start: bool = False) -> RecycleDrafter:
    target = tiny_target(vocab=VOCAB)
    made = weight_free("recycle", target.model.config)
    made.hot_start = hot_start
    return made.attach(target.embed_weight, target.head_weight)


def logits_ranking(*orders: list[int], gaps: tuple[float, ...] = ()) -> torch.Tensor:
    """Logits rows in which each given list of tokens is ranked first, in its order, `gaps[row]` (default 1) apart;
    then the rest, by id."""
    rows = torch.zeros(len(orders), VOCAB)
    for i, (row, order) in enumerate(zip(rows, orders)):
        row -= torch.arange(VOCAB) * 0.01
        for rank, token in enumerate(order):
            row[token] = 10.0 - rank * (gaps[i] if i < len(gaps) else 1.0)
    return rows


# --- the table -------------------------------------------------------------------------------------------------------
def test_the_table_keeps_each_tokens_top_k_from_the_logits():
    recycle = drafter()
    logits = torch.randn(3, VOCAB, generator=torch.Generator().manual_seed(0)) * 3
    recycle.record(torch.tensor([5, 2, 9]), logits)
    width = recycle.width
    assert recycle.next_ids.shape == (VOCAB, width) and recycle.next_ids.dtype == torch.int32
    top, ids = torch.topk(torch.log_softmax(logits, -1), width)
    for row, token in enumerate([5, 2, 9]):
        assert recycle.next_ids[token].tolist() == ids[row].tolist()
        assert torch.allclose(recycle.next_logp[token], top[row], atol=1e-5)
    unseen = [t for t in range(VOCAB) if t not in (5, 2, 9)]
    assert (recycle.next_ids[unseen] == -1).all() and torch.isinf(recycle.next_logp[unseen]).all()


def test_a_later_write_replaces_a_row_and_the_last_of_repeated_tokens_wins():
    recycle = drafter()
    recycle.record(torch.tensor([4]), logits_ranking([1, 2, 3]))
    assert recycle.next_ids[4, :3].tolist() == [1, 2, 3]
    recycle.record(torch.tensor([4, 7, 4]), logits_ranking([6, 5], [8], [3, 1]))
    assert recycle.next_ids[4, :2].tolist() == [3, 1] and recycle.next_ids[7, 0] == 8


def test_the_prefill_fills_the_table_from_the_prompts_last_rows(monkeypatch):
    monkeypatch.setattr(recycle_module, "PROMPT_ROWS", 5)
    monkeypatch.setattr(recycle_module, "CHUNK", 2)
    target = tiny_target(vocab=VOCAB)
    recycle = weight_free("recycle", target.model.config).attach(target.embed_weight, target.head_weight)
    prompt = torch.tensor([3, 1, 4, 1, 5, 9, 2, 6])
    features = target.features(prompt, target.new_cache())
    recycle.reset()
    recycle.observe(prompt, features)  # the engine's call after the prefill: no logits
    expected = torch.topk(target.logits(features), recycle.width).indices
    for i in range(3, 8):  # the last 5 positions, token 1 written by the later one
        assert recycle.next_ids[int(prompt[i])].tolist() == expected[i].tolist()
    assert (recycle.next_ids[[3, 4]] == -1).all()  # the first positions are beyond PROMPT_ROWS


def test_the_prefill_computes_one_row_per_distinct_token_its_last(monkeypatch):
    """A token's earlier rows would be overwritten by its last one: the prefill never puts them through the head."""
    target = tiny_target(vocab=VOCAB)
    recycle = weight_free("recycle", target.model.config).attach(target.embed_weight, target.head_weight)
    prompt = torch.tensor([7, 3, 1, 3, 1, 3, 8, 1])
    features = target.features(prompt, target.new_cache())
    rows = []
    head = recycle.head_logits
    monkeypatch.setattr(recycle, "head_logits", lambda hidden: rows.append(hidden.shape[0]) or head(hidden))
    recycle.reset()
    recycle.observe(prompt, features)
    assert sum(rows) == 4  # tokens 7, 3, 8, 1
    expected = torch.topk(target.logits(features), recycle.width).indices
    for token, last in ((7, 0), (3, 5), (8, 6), (1, 7)):
        assert recycle.next_ids[token].tolist() == expected[last].tolist()


def test_the_prompt_rows_go_through_a_packed_head_where_lookups_few_do_not():
    """Recycling's prefill runs hundreds of prompt rows through the lm_head: its copy is oneDNN-packed (the
    learned drafters' too); prompt lookup's, which reads at most a few rows, is not. Either way fp32."""
    target = tiny_target(vocab=VOCAB)
    recycle = weight_free("recycle", target.model.config).attach(target.embed_weight, target.head_weight)
    lookup = weight_free("lookup", target.model.config).attach(target.embed_weight, target.head_weight)
    assert recycle._head.pack and not lookup._head.pack
    features = torch.randn(6, target.embed_weight.shape[1])
    torch.testing.assert_close(recycle.head_logits(features), features @ target.head_weight.T)


def test_reset_empties_the_table_unless_hot_start():
    for hot in (False, True):
        recycle = drafter(hot_start=hot)
        recycle.record(torch.tensor([4]), logits_ranking([1, 2]))
        recycle.reset()
        assert (recycle.next_ids[4, 0] == 1) == hot


# --- drafting ----------------------------------------------------------------------------------------------------------
def test_the_tree_follows_the_table_best_first():
    recycle = drafter()
    recycle.record(torch.tensor([0, 1, 2, 5, 6]),  # the root prefers 1 to 2 by far
                   logits_ranking([1, 2, 3], [5, 6, 7], [8, 9, 10], [11, 12, 13], [14, 15, 4], gaps=(5.0,)))
    pool = recycle.propose(torch.zeros(1, 32), torch.tensor([0]), TreeSettings(top_k=2, depth=3, total_tokens=7))
    tokens, parents, scores = (torch.cat(x).tolist() for x in (pool.tokens, pool.parents, pool.scores))
    assert set(pool.sources) == {"recycle"} and pool.depths == [1, 1, 2, 2, 2, 2, 3, 3, 3, 3]
    assert tokens[:2] == [1, 2] and parents[:2] == [-1, -1]  # the root's row, best first
    assert tokens[2:6] == [5, 6, 8, 9] and parents[2:6] == [0, 0, 1, 1]  # each depth-1 node's row
    # Depth 3 grows from the 2 best depth-2 nodes only (1 -> 5 and 1 -> 6, the root's best row entries).
    assert tokens[6:] == [11, 12, 14, 15] and parents[6:] == [2, 2, 3, 3]
    for i, parent in enumerate(parents):
        assert scores[i] <= (scores[parent] if parent >= 0 else 0.0)
    tree = build_tree(0, pool, 7)  # the rerank keeps a tree
    assert tree.size == 7 and all(p < i for i, p in enumerate(tree.parents))


def test_an_unseen_root_drafts_nothing_and_top_k_is_bounded_by_the_table():
    recycle = drafter()
    shape = TreeSettings.default("recycle", "cpu")
    assert recycle.propose(torch.zeros(1, 32), torch.tensor([3]), shape).size == 0  # nothing recorded yet
    recycle.record(torch.tensor([15]), logits_ranking([1, 2, 3, 4]))
    assert recycle.propose(torch.zeros(1, 32), torch.tensor([3]), shape).size == 0  # 3 has no row
    assert recycle.propose(torch.zeros(1, 32), torch.tensor([15]), shape).size == 4  # its children 1-4 have none
    with pytest.raises(GumihoError, match="top-k must be at most"):
        TreeSettings(top_k=RECYCLE_WIDTH + 1, depth=2, total_tokens=4).validate("recycle")
    with pytest.raises(GumihoError, match=f"top-k must be at most {VOCAB}"):  # a 16-token vocabulary has 16 at most
        drafter().check_tree(TreeSettings(top_k=VOCAB + 1, depth=2, total_tokens=4))
    with pytest.raises(GumihoError, match="no weights to save"):
        recycle.save_pretrained("unused")


# --- the engine's hook -------------------------------------------------------------------------------------------------
class Spy(RecycleDrafter):
    """Records every `observe` call."""

    calls: list

    def observe(self, tokens, features, logits=None, parents=None):
        self.calls.append((tokens.tolist(), features.shape, None if logits is None else len(logits), parents))
        super().observe(tokens, features, logits, parents)
        self.last = (tokens.tolist(), logits)


def test_the_engine_shows_the_drafter_every_target_forward():
    engine = tiny_engine(seed=3)
    spy = Spy(engine.drafters["recycle"].config)
    spy.calls = []
    engine.add_drafter("recycle", spy)
    prompt = [1, 2, 3, 4, 1, 2]
    trace = engine.generate("", "recycle", GenerationConfig(max_new_tokens=20), prompt_ids=prompt)
    assert spy.calls[0] == (prompt, (6, 32), None, None)  # the prefill: the prompt, no logits
    assert len(spy.calls) == 1 + trace.cycles
    for (tokens, features, logits, parents), step in zip(spy.calls[1:], trace.steps):
        assert tokens == [n.token_id for n in step.nodes] and parents == [n.parent for n in step.nodes]
        assert features == (step.tree_size, 32) and logits == step.tree_size
    # The table learns from the rows the verification computed (free): greedy's walk reads the accepted path. After
    # the last cycle it holds, for each of their tokens, the target's top tokens after that token's last node; the
    # root's (a token that occurs once) starts with the target's argmax, which greedy decoding emitted.
    tokens, logits = spy.last
    nodes, rows = logits.computed()
    step = trace.steps[-1]
    assert nodes == step.accepted_nodes and rows.shape == (len(nodes), VOCAB)
    for token in {tokens[n] for n in nodes}:
        last = max(i for i, n in enumerate(nodes) if tokens[n] == token)
        assert spy.next_ids[token].tolist() == torch.topk(rows[last], spy.width).indices.tolist()
    if tokens.count(tokens[0]) == 1:
        assert int(spy.next_ids[tokens[0], 0]) == step.emitted[0]


def test_a_drafter_without_the_hook_is_unaffected():
    assert Drafter.observe is not RecycleDrafter.observe
    engine = tiny_engine(seed=3)
    assert engine.drafters["eagle2"].observe(torch.tensor([1]), torch.zeros(1, 32)) is None


# --- the real model --------------------------------------------------------------------------------------------------
REPEATING = "Count from 1 to 20, separated by commas."  # the model's "1. 1\n2. 2\n..." repeats its own patterns


@pytest.mark.slow
def test_greedy_recycle_equals_ar_on_the_default_model(smollm):
    config = GenerationConfig(max_new_tokens=24)
    ar = smollm.generate(REPEATING, "ar", config)
    run = smollm.generate(REPEATING, "recycle", config)
    assert run.token_ids == ar.token_ids
    assert sum(step.accept_length for step in run.steps) >= 3, "recycled candidates must get accepted"
    assert run.cycles < ar.cycles and run.drafter == ""
    # The table's nodes, and prompt lookup's where the switch took a 3-token match (the CPU default, tree.py).
    assert {"root", "recycle"} <= {n.source for s in run.steps for n in s.nodes} <= {"root", "recycle", "lookup"}
    assert all(s.tree_size <= run.settings.tree["total_tokens"] for s in run.steps)


def test_the_default_engine_offers_both_methods_without_folders():
    from gumiho.loader import default_drafters

    drafters = default_drafters(None)
    assert drafters["lookup"] is None and drafters["recycle"] is None
    assert set(default_drafters("some/other-model")) >= {"lookup", "recycle", "eagle2", "gumiho"}


def test_a_folder_for_a_method_without_weights_is_refused():
    from gumiho.loader import load_drafters

    target = tiny_target()
    with pytest.raises(GumihoError, match="recycle drafts without weights"):
        load_drafters(target, None, {"recycle": "some/folder"})
    loaded = load_drafters(target, None, {"lookup": None, "recycle": None})
    assert {m: name for m, (_, name) in loaded.items()} == {"lookup": "", "recycle": ""}
    Engine(target, {m: d for m, (d, _) in loaded.items()})


# --- the command line ------------------------------------------------------------------------------------------------
def run_cli(capsys, *args: str) -> tuple[int, str, str]:
    try:
        code = main(["generate", "--prompt", "hi", *args])
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("args,message", [
    (["--method", "recycle", "--drafter", "some/folder"], "recycle drafts without weights"),
    (["--method", "recycle", "--tree-top-k", "17"], "--tree-top-k must be at most 16"),
    (["--method", "recycle", "--total-tokens", "0"], "--total-tokens must be >= 1 or 'auto'"),
    (["--method", "recycle", "--max-ngram", "2"], "--max-ngram and --min-ngram are lookup options"),
])
def test_bad_recycle_options_fail_fast_with_one_line(capsys, args, message):
    code, out, err = run_cli(capsys, *args)
    assert code == 2 and out == ""
    assert err.strip().splitlines() == [err.strip()] and message in err


def test_a_drafter_folder_for_recycle_from_a_real_process():
    proc = subprocess.run([sys.executable, "-m", "gumiho", "generate", "--prompt", "hi", "--method", "recycle",
                           "--drafter", "assets/drafters/smollm2-135m-eagle2"], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip() == "error: recycle drafts without weights: --drafter does not apply to it"
