"""Greedy speculative decoding returns exactly the AR loop's tokens, whatever the drafter proposes."""

from __future__ import annotations

import pytest
import torch

from gumiho.engine import GenerationConfig
from gumiho.tree import TreeSettings

from .conftest import DRAFTED, tiny_engine

HEAD_SHAPES = [TreeSettings(top_k=10, depth=4, total_tokens=6), TreeSettings(top_k=10, depth=4, total_tokens=64),
               TreeSettings(top_k=10, depth=2, total_tokens=12)]  # Medusa's and Hydra's static tree
SHAPES = {
    "medusa": HEAD_SHAPES,
    "hydra": HEAD_SHAPES,
    "eagle1": [TreeSettings(top_k=4, depth=5, total_tokens=6), TreeSettings(top_k=4, depth=5, total_tokens=26),
               TreeSettings(top_k=4, depth=3, total_tokens=12)],
    "eagle2": [TreeSettings(top_k=2, depth=3, total_tokens=6), TreeSettings(top_k=4, depth=5, total_tokens=24),
               TreeSettings(top_k=3, depth=2, total_tokens=12)],
    "gumiho": [TreeSettings(top_k=2, depth=3, total_tokens=6, mlptopk=2, pruning=2),
               TreeSettings(top_k=4, depth=6, total_tokens=24, mlptopk=6, pruning=6),
               TreeSettings(top_k=3, depth=6, total_tokens=32, mlptopk=4, pruning=8, mlp_parent_align=False,
                            serial_tree_mask=False)],
    "lookup": [TreeSettings(top_k=4, depth=6, total_tokens=8, max_ngram=3, min_ngram=1),
               TreeSettings(top_k=8, depth=8, total_tokens=40, max_ngram=4, min_ngram=2),
               TreeSettings(top_k=1, depth=3, total_tokens=4, max_ngram=1, min_ngram=1)],
    "recycle": [TreeSettings(top_k=4, depth=5, total_tokens=8), TreeSettings(top_k=8, depth=6, total_tokens=48),
                TreeSettings(top_k=2, depth=2, total_tokens=4, lookup_merge=2)],  # with prompt lookup's switch
}


def prompt_for(seed: int, vocab: int) -> list[int]:
    g = torch.Generator().manual_seed(1000 + seed)
    return torch.randint(0, vocab, (int(torch.randint(3, 20, (1,), generator=g)),), generator=g).tolist()


@pytest.mark.parametrize("method", list(SHAPES))
def test_greedy_equals_ar_on_tiny_models(method):
    accepted = 0
    for seed in range(8):
        engine = tiny_engine(seed=seed, vocab=16, drafter_seed=seed)
        ids = prompt_for(seed, 16)
        ar = engine.generate("", "ar", GenerationConfig(max_new_tokens=40), prompt_ids=ids)
        assert ar.new_tokens == 40 and ar.cycles == 39 and ar.tau == 1.0
        for shape in SHAPES[method]:
            run = engine.generate("", method, GenerationConfig(max_new_tokens=40, tree=shape), prompt_ids=ids)
            assert run.token_ids == ar.token_ids, f"seed {seed}, {shape}"
            accepted += sum(s.accept_length for s in run.steps)
            assert all(s.tree_size <= shape.total_tokens for s in run.steps)
    # The property only means something if drafts were accepted, several tokens deep.
    assert accepted > 100


@pytest.mark.parametrize("method", DRAFTED)
def test_the_gpu_trees_run_on_a_vocabulary_smaller_than_their_top_k(method):
    """CUDA's default trees (Gumiho's 35 MLP candidates per head) on a 16-token model: the drafters propose fewer
    candidates instead of failing, and greedy output still equals AR."""
    engine = tiny_engine(seed=1, vocab=16, drafter_seed=1)
    ids = prompt_for(1, 16)
    ar = engine.generate("", "ar", GenerationConfig(max_new_tokens=20), prompt_ids=ids)
    tree = TreeSettings.default(method, "cuda")
    run = engine.generate("", method, GenerationConfig(max_new_tokens=20, tree=tree), prompt_ids=ids)
    assert run.token_ids == ar.token_ids


def test_trace_records_what_was_emitted():
    engine = tiny_engine(seed=3, vocab=16, drafter_seed=3)
    ids = prompt_for(3, 16)
    trace = engine.generate("", "gumiho", GenerationConfig(max_new_tokens=30), prompt_ids=ids)
    emitted = [trace.first_token] + [t for s in trace.steps for t in s.emitted]
    assert emitted == trace.token_ids
    for step in trace.steps:
        assert step.emitted == step.accepted_tokens + [step.bonus_token] or len(trace.token_ids) == 30
        nodes = {n.id: n for n in step.nodes}
        assert [nodes[i].token_id for i in step.accepted_nodes[1:]] == step.accepted_tokens
        assert max(p.accepted for p in step.paths) == step.accept_length
    assert trace.tau == pytest.approx((trace.new_tokens - 1) / trace.cycles)


@pytest.mark.parametrize("budget", [1, 2, 7, 23])
def test_max_new_tokens_is_exact(budget):
    engine = tiny_engine(seed=1, vocab=16, drafter_seed=1)
    for method in ("ar", *DRAFTED):
        trace = engine.generate("", method, GenerationConfig(max_new_tokens=budget), prompt_ids=prompt_for(1, 16))
        assert trace.new_tokens == budget and trace.finish_reason == "length"


def test_eos_stops_every_method_at_the_same_token():
    engine = tiny_engine(seed=2, vocab=16, drafter_seed=2)
    ids = prompt_for(2, 16)
    reference = engine.generate("", "ar", GenerationConfig(max_new_tokens=40), prompt_ids=ids).token_ids
    eos = reference[12]
    engine.target.eos_ids = {eos}
    expected = reference[: reference.index(eos) + 1]
    for method in ("ar", *DRAFTED):
        trace = engine.generate("", method, GenerationConfig(max_new_tokens=40), prompt_ids=ids)
        assert trace.token_ids == expected and trace.finish_reason == "eos"


def test_context_limit_stops_without_overflow():
    engine = tiny_engine(seed=4, vocab=16, drafter_seed=4)
    limit = engine.target.max_context
    ids = prompt_for(4, 16) * 60
    ids = (ids * 2)[: limit - 10]
    ar = engine.generate("", "ar", GenerationConfig(max_new_tokens=50), prompt_ids=ids)
    assert ar.finish_reason == "context" and len(ids) + ar.new_tokens == limit + 1
    spec = engine.generate("", "gumiho", GenerationConfig(max_new_tokens=50), prompt_ids=ids)
    assert spec.token_ids == ar.token_ids and spec.finish_reason == "context"


def test_stop_cancels_between_cycles():
    engine = tiny_engine(seed=5)
    run = engine.run("", "eagle2", GenerationConfig(max_new_tokens=100), prompt_ids=prompt_for(5, 16))
    for i, _ in enumerate(run):
        if i == 2:
            run.stop()
    assert run.trace.finish_reason == "stopped" and run.trace.cycles == 3


def test_fta_flags_filled_positions_and_reports_equality_rate(record_property):
    same, total, fta_cycles = 0, 0, 0
    for seed in range(6):
        engine = tiny_engine(seed=seed, vocab=16, drafter_seed=seed)
        ids = prompt_for(seed, 16)
        ar = engine.generate("", "ar", GenerationConfig(max_new_tokens=30), prompt_ids=ids)
        shape = TreeSettings(top_k=3, depth=6, total_tokens=16, mlptopk=3, pruning=3, fta=True)
        trace = engine.generate("", "gumiho", GenerationConfig(max_new_tokens=30, tree=shape), prompt_ids=ids)
        assert trace.settings.fta_applied
        for step in trace.steps:
            depth = max(n.depth for n in step.nodes)
            for path in step.paths:
                assert len(path.nodes) == depth + 1, "FTA pads every path to the full depth"
                real = [not f for f in path.filled]
                assert real == sorted(real, reverse=True), "borrowed positions only at the end of a path"
            if any(any(p.filled) for p in step.paths):
                fta_cycles += 1
        total += 1
        same += trace.token_ids == ar.token_ids
    assert fta_cycles > 0
    record_property("fta_greedy_equality_rate", same / total)
    print(f"FTA greedy equality rate vs AR on tiny models: {same}/{total}")


def test_a_target_whose_attention_would_ignore_the_tree_mask_is_refused():
    from dataclasses import replace

    from gumiho.errors import GumihoError

    target = tiny_engine().target
    target.model.config._attn_implementation = "eager"  # adds a boolean mask to the scores: nothing masked
    with pytest.raises(GumihoError, match="runs 'eager' attention; tree verification needs 'sdpa'"):
        replace(target)


@pytest.mark.parametrize("method", ["eagle2", "gumiho"])
def test_a_feature_drafter_reads_a_long_prompts_last_pairs_only(method, monkeypatch):
    """Of a prompt longer than the drafter's window, the draft layers read the last PROMPT_WINDOW pairs (the first
    draft's cost and every draft step's attention); the output is still AR's, and drafts are still accepted."""
    from gumiho.drafters import base

    monkeypatch.setattr(base, "PROMPT_WINDOW", 8)
    engine = tiny_engine(seed=3, vocab=16, drafter_seed=3)
    drafter = engine.drafters[method]
    lengths = []
    original = type(drafter).draft

    def draft(self, features, tokens, tree):
        lengths.append((self.cache.length, tokens.shape[0]))
        return original(self, features, tokens, tree)

    monkeypatch.setattr(type(drafter), "draft", draft)
    ids = torch.randint(0, 16, (40,), generator=torch.Generator().manual_seed(7)).tolist()
    ar = engine.generate("", "ar", GenerationConfig(max_new_tokens=30), prompt_ids=ids)
    run = engine.generate("", method, GenerationConfig(max_new_tokens=30, tree=SHAPES[method][0]), prompt_ids=ids)
    assert run.token_ids == ar.token_ids
    assert lengths[0] == (0, 8)  # the first draft: an empty cache and the prompt's last 8 pairs of 40
    assert all(past >= 8 for past, _ in lengths[1:])  # later drafts extend the window's cache
    assert sum(s.accept_length for s in run.steps) > 0
