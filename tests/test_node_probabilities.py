"""Each traced node's q (the drafter's probability of its token), p (the target's) and, when sampling, the test's
threshold and draw, checked against plain forwards of the tiny models; old traces still load."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from gumiho.engine import Engine, GenerationConfig
from gumiho.sampling import SamplingConfig, probabilities
from gumiho.trace import CycleTrace, GenerationTrace
from gumiho.tree import TreeSettings

from .conftest import random_drafter, tiny_engine, tiny_target

PROMPT = [1, 2, 3, 4]
OLD_TRACES = Path(__file__).with_name("traces")
SAMPLED = SamplingConfig(temperature=0.8, top_p=0.9)


def generate(engine: Engine, method: str, sampling: SamplingConfig = SamplingConfig(),
             tree: TreeSettings | None = None, trace: bool = True) -> GenerationTrace:
    config = GenerationConfig(max_new_tokens=16, sampling=sampling, seed=3, tree=tree, trace=trace)
    return engine.generate("", method, config, prompt_ids=PROMPT)


def prefixes(trace: GenerationTrace) -> list[list[int]]:
    """Per cycle, the sequence its root ends: the prompt and every token emitted before the cycle."""
    sequence, out = PROMPT + [trace.first_token], []
    for cycle in trace.steps:
        out.append(list(sequence))
        sequence += cycle.emitted
    return out


def target_dist(engine: Engine, sequence: list[int], sampling: SamplingConfig) -> torch.Tensor:
    """The target's next-token distribution after `sequence`, from a plain forward of the whole sequence."""
    with torch.no_grad():
        logits = engine.target.model(torch.tensor([sequence])).logits[0, -1]
    return torch.softmax(logits.float(), -1) if sampling.greedy else probabilities(logits, sampling)


def parents_on_path(cycle: CycleTrace) -> dict[int, list[int]]:
    """Nodes whose parent the target accepted (the rows the acceptance walk read): node -> tokens from the root to
    its parent, root excluded."""
    nodes = {n.id: n for n in cycle.nodes}
    path = cycle.accepted_nodes
    return {n.id: [nodes[i].token_id for i in path[1: path.index(n.parent) + 1]]
            for n in cycle.nodes if n.parent in path}


@pytest.mark.parametrize("method", ["gumiho", "eagle2", "medusa", "recycle"])
@pytest.mark.parametrize("sampling", [SamplingConfig(), SAMPLED], ids=["greedy", "sampled"])
def test_p_is_the_targets_probability_at_the_parent(method, sampling):
    engine = tiny_engine(seed=9, vocab=16, drafter_seed=9)
    trace = generate(engine, method, sampling)
    checked = 0
    for cycle, prefix in zip(trace.steps, prefixes(trace)):
        nodes = {n.id: n for n in cycle.nodes}
        for node, above in parents_on_path(cycle).items():
            dist = target_dist(engine, prefix + above, sampling)
            assert nodes[node].p == pytest.approx(float(dist[nodes[node].token_id]), rel=1e-4, abs=1e-6)
            if sampling.greedy and node in cycle.accepted_nodes:
                assert nodes[node].token_id == int(dist.argmax())
            checked += 1
    assert checked > len(trace.steps)  # every cycle has children under its root, and some accept more


def test_greedy_verification_computes_no_extra_rows_for_p():
    """Under a node the target did not accept, no head row was read, so its children's p stays unknown."""
    engine = tiny_engine(seed=9, vocab=16, drafter_seed=9)
    trace = generate(engine, "gumiho", tree=TreeSettings(top_k=3, depth=4, total_tokens=10, mlptopk=3, pruning=3))
    unknown = [n for c in trace.steps for n in c.nodes if n.parent >= 0 and n.parent not in c.accepted_nodes]
    assert unknown and all(n.p is None for n in unknown)
    assert all(n.q is not None for c in trace.steps for n in c.nodes if n.parent >= 0)
    assert all(n.accept is None and n.draw is None for c in trace.steps for n in c.nodes)


def test_q_is_the_drafters_probability_at_the_parent():
    """EAGLE-2's depth-1 nodes against the softmax of the draft head's first logits of each cycle; deeper nodes
    against their parents' through the scores."""
    engine = tiny_engine(seed=9, vocab=16, drafter_seed=9)
    drafter = engine.drafters["eagle2"]
    head, propose = drafter.head_logits, drafter.propose
    roots: list[torch.Tensor] = []  # the first draft-head row of each propose: the root's
    waiting: list[bool] = []

    def first_row(hidden: torch.Tensor) -> torch.Tensor:
        logits = head(hidden)
        if waiting:
            roots.append(logits[0])
            waiting.clear()
        return logits

    def counted(*args):
        waiting.append(True)
        return propose(*args)

    drafter.head_logits, drafter.propose = first_row, counted
    trace = generate(engine, "eagle2", tree=TreeSettings(top_k=3, depth=3, total_tokens=8))
    assert len(roots) == len(trace.steps)
    for cycle, logits in zip(trace.steps, roots):
        dist = torch.softmax(logits.float(), -1)
        for node in cycle.nodes:
            if node.depth == 1:
                assert node.q == pytest.approx(float(dist[node.token_id]), rel=1e-4)
            elif node.depth > 1:
                parent = cycle.nodes[node.parent]
                assert node.q == pytest.approx(math.exp(node.score - parent.score))
                assert 0 < node.q <= 1


def test_sampled_tests_record_the_threshold_and_the_draw_that_decided():
    engine = tiny_engine(seed=9, vocab=16, drafter_seed=9)
    trace = generate(engine, "medusa", SAMPLED)
    passed = failed = 0
    for cycle in trace.steps:
        accepted = set(cycle.accepted_nodes)
        siblings: dict[int, list] = {}
        for node in cycle.nodes[1:]:
            siblings.setdefault(node.parent, []).append(node)
        for parent, children in siblings.items():
            tested = [n for n in children if n.draw is not None]
            if not tested:
                assert parent not in accepted  # the walk never reached it
                continue
            first = tested[0]
            assert first is children[0] and first.accept == pytest.approx(first.p, rel=1e-5)
            left = 1.0
            for node in tested:  # the residual after each rejected sibling: accept = p / (1 - rejected mass)
                assert node.accept == pytest.approx(node.p / left, rel=1e-4)
                assert 0 <= node.draw < 1
                if node.id in accepted:
                    assert node.draw < node.accept and node is tested[-1]
                    passed += 1
                else:
                    assert node.draw >= node.accept
                    failed += 1
                left -= node.p
    assert passed and failed


def test_recording_p_and_q_changes_no_token():
    engine = tiny_engine(seed=9, vocab=16, drafter_seed=9)
    for sampling in (SamplingConfig(), SAMPLED):
        traced = generate(engine, "gumiho", sampling)
        plain = generate(engine, "gumiho", sampling, trace=False)
        assert traced.token_ids == plain.token_ids


def test_mjsd_nodes_multiply_to_the_joint_probability():
    target = tiny_target(3)
    engine = Engine(target, {"mjsd": random_drafter("mjsd", target, 3)})
    tree = TreeSettings(top_k=4, depth=4, total_tokens=5, tau_acc=0.5)
    for sampling in (SamplingConfig(), SamplingConfig(temperature=0.8)):
        trace = generate(engine, "mjsd", sampling, tree)
        for cycle in trace.steps:
            chain = [n.p for n in cycle.nodes[1:]]
            for check in cycle.joint:
                assert math.prod(chain[: check.length]) == pytest.approx(check.p, rel=1e-5)


@pytest.mark.parametrize("name,schema", [("trace-v1-gumiho.json", 1), ("trace-v2-gumiho.json", 2)])
def test_old_traces_still_load(name, schema):
    text = (OLD_TRACES / name).read_text(encoding="utf-8")
    assert f'"schema": {schema}' in text
    trace = GenerationTrace.from_json(text)
    nodes = [n for c in trace.steps for n in c.nodes]
    assert trace.steps and nodes and all(n.p is None and n.q is None and n.draw is None for n in nodes)
    assert GenerationTrace.from_json(trace.to_json()) == trace
