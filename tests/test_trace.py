"""Trace JSON round trip and validation of untrusted trace files."""

from __future__ import annotations

import json

import pytest

from gumiho.engine import GenerationConfig
from gumiho.trace import GenerationTrace, TraceError

from .conftest import DRAFTED, tiny_engine


@pytest.fixture(scope="module")
def trace() -> GenerationTrace:
    engine = tiny_engine(seed=9, vocab=16, drafter_seed=9)
    return engine.generate("", "gumiho", GenerationConfig(max_new_tokens=20), prompt_ids=[1, 2, 3, 4])


def test_round_trip(trace):
    text = trace.to_json()
    again = GenerationTrace.from_json(text)
    assert again == trace
    data = json.loads(text)
    assert data["tau"] == pytest.approx(trace.tau) and data["new_tokens"] == 20
    assert data["schema"] == 3 and data["steps"][0]["nodes"][0]["source"] == "root"
    assert data["steps"][0]["nodes"][0]["p"] is None and data["steps"][0]["nodes"][1]["q"] is not None


@pytest.mark.parametrize("method", ["ar", *DRAFTED])
def test_every_method_round_trips(method):
    engine = tiny_engine(seed=9, vocab=16, drafter_seed=9)
    trace = engine.generate("", method, GenerationConfig(max_new_tokens=12), prompt_ids=[1, 2, 3, 4])
    again = GenerationTrace.from_json(trace.to_json())
    assert again == trace and again.method == method
    if method in ("medusa", "hydra"):
        assert {n.source for s in again.steps for n in s.nodes} >= {"root", f"{method}-1", f"{method}-2"}


def test_trace_off_keeps_the_numbers_but_not_the_trees():
    engine = tiny_engine(seed=9, vocab=16, drafter_seed=9)
    off = engine.generate("", "gumiho", GenerationConfig(max_new_tokens=20, trace=False), prompt_ids=[1, 2, 3, 4])
    on = engine.generate("", "gumiho", GenerationConfig(max_new_tokens=20), prompt_ids=[1, 2, 3, 4])
    assert off.steps == [] and off.cycles == on.cycles and off.token_ids == on.token_ids


@pytest.mark.parametrize("mutate,message", [
    (lambda d: d.update(schema=99), "unsupported trace schema"),
    (lambda d: d.update(method="beam"), "unknown method"),
    (lambda d: d.pop("prompt"), "malformed trace"),
    (lambda d: d["steps"][0]["nodes"][1].update(parent=42), "parent"),
    (lambda d: d["steps"][0]["paths"][0]["nodes"].append(999), "not in the tree"),
    (lambda d: d["steps"][0].pop("bonus_token"), "malformed trace"),
    (lambda d: d["steps"].append("nope"), "malformed trace"),
    (lambda d: d["steps"][0]["paths"][0].update(nodes=[], filled=[]), "a path is empty"),
    (lambda d: d["steps"][0]["nodes"][1].update(id=7), "node ids must be 0, 1, 2"),
    (lambda d: d["steps"][0]["nodes"][1].update(score="high"), "wrong type"),
    (lambda d: d["steps"][0]["nodes"][1].update(text=None), "wrong type"),
    (lambda d: d["steps"][0]["nodes"][1].update(q="likely"), "not a number"),
    (lambda d: d["steps"][0]["nodes"][1].update(draw=True), "not a number"),
])
def test_invalid_traces_are_rejected_with_a_reason(trace, mutate, message):
    data = json.loads(trace.to_json())
    mutate(data)
    with pytest.raises(TraceError, match=message):
        GenerationTrace.from_dict(data)


@pytest.mark.parametrize("text,message", [("{not json", "not valid JSON"), ("[1, 2]", "JSON object")])
def test_not_a_trace(text, message):
    with pytest.raises(TraceError, match=message):
        GenerationTrace.from_json(text)
