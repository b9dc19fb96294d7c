"""Durable links without a browser: parsing what a link asks for, and building one from a state."""

from __future__ import annotations

from urllib.parse import parse_qsl

import pytest

from app.links import MAX_PROMPT_CHARS, LinkState
from app.validate import Limits


def parse(query: str, limits: Limits = Limits()) -> tuple[LinkState, list[str]]:
    return LinkState.parse(dict(parse_qsl(query, keep_blank_values=True)), limits)


def test_an_example_link_reads_back():
    link, problems = parse("tab=explore&example=3-haiku&method=eagle2&cycle=4&present=1")
    assert problems == []
    assert link == LinkState(tab="explore", example="3-haiku", method="eagle2", cycle=4, present=True)


def test_a_live_run_link_reads_every_setting():
    link, problems = parse("prompt=Name+three+fruits.&method=gumiho&temperature=0.7&top_p=0.9&seed=7"
                           "&max_new_tokens=32&top_k=4&depth=5&total_tokens=24&mlptopk=6&pruning=6&tau_acc=0.5&fta=1")
    assert problems == []
    assert link.prompt == "Name three fruits." and link.method == "gumiho" and link.fta is True
    assert link.settings == {"temperature": 0.7, "top_p": 0.9, "seed": 7, "max_new_tokens": 32, "top_k": 4,
                             "depth": 5, "total_tokens": 24, "mlptopk": 6, "pruning": 6, "tau_acc": 0.5}
    assert isinstance(link.settings["seed"], int) and isinstance(link.settings["temperature"], float)
    assert link.pinned() == {*link.settings, "fta"}


def test_a_race_link_reads_its_methods():
    link, problems = parse("tab=race&prompt=Hi&methods=eagle2,+gumiho,ar,gumiho")
    assert problems == [] and link.tab == "race" and link.methods == ("eagle2", "gumiho")


@pytest.mark.parametrize("state", [
    LinkState(),
    LinkState(tab="lesson"),
    LinkState(tab="explore", example="3-haiku", method="mjsd", cycle=0, present=True),
    LinkState(tab="race", prompt="Ünïcödé & <b>bold</b> + 100% = ?\nsecond line", methods=("medusa", "recycle"),
              settings={"temperature": 0.35, "max_new_tokens": 64, "top_k": 4, "total_tokens": 12}, fta=False),
    LinkState(prompt="x", method="ar", settings={"seed": 2**63 - 1, "top_p": 0.05, "tau_acc": 1.0}),
])
def test_to_query_and_parse_round_trip(state):
    assert parse(state.to_query()) == (state, [])


def test_to_query_names_only_what_is_set_in_a_fixed_order():
    state = LinkState(tab="race", example="1-study-tips", cycle=2, settings={"top_k": 4, "temperature": 0.0})
    assert state.to_query() == "tab=race&example=1-study-tips&cycle=2&temperature=0.0&top_k=4"


def test_unknown_parameters_are_named_in_one_problem():
    link, problems = parse("tab=race&foo=1&bar=2&baz=3&qux=4&utm_source=x")
    assert link == LinkState(tab="race")
    assert problems == ["unknown parameters 'foo', 'bar', 'baz' and 2 more"]


@pytest.mark.parametrize("query, expected", [
    ("tab=settings", "tab must be one of explore, race, bench, lesson, got 'settings'"),
    ("method=nope", "method must be one of ar, medusa, hydra, eagle1, eagle2, gumiho, mjsd, lookup, recycle, "
                    "got 'nope'"),
    ("methods=eagle2,nope", "methods must be among medusa, hydra, eagle1, eagle2, gumiho, mjsd, lookup, recycle, "
                            "got 'nope'"),
    ("methods=ar", "pick at least one method to race against AR"),
    ("cycle=-1", "cycle must be between 0 and 100000, got -1"),
    ("cycle=1.5", "cycle must be a whole number (0 to 100000), got 1.5"),
    ("cycle=" + "9" * 5000, "cycle must be a finite number (0 to 100000), got inf"),
    ("temperature=9", "temperature must be between 0 and 2, got 9"),
    ("temperature=nan", "temperature must be a finite number (0 to 2), got nan"),
    ("temperature=warm", "temperature must be a number (0 to 2), got 'warm'"),
    ("seed=", "seed must be a number (0 to 2^63-1), got ''"),
    ("max_new_tokens=100000", "max new tokens must be between 1 and 512, got 100000"),
    ("top_k=0x10", "top-k must be a number (1 to 16), got '0x10'"),
    ("fta=maybe", "fta must be 1 or 0, got 'maybe'"),
    ("example=../../etc/passwd", "example must be a recorded example's name, got '../../etc/passwd'"),
    ("prompt=+++", "the prompt is empty"),
])
def test_a_malformed_parameter_is_left_out_with_its_reason(query, expected):
    link, problems = parse(f"{query}&cycle=3&top_p=0.5" if not query.startswith("cycle") else f"{query}&top_p=0.5")
    assert problems == [expected]
    assert link.settings.get("top_p") == 0.5, "the rest of the link still applies"


def test_a_prompt_longer_than_a_link_carries_is_left_out():
    link, problems = parse(f"prompt={'a' * 10_000}&method=eagle2&seed=5")
    assert problems == [f"the prompt is 10,000 characters; a link carries prompts of up to {MAX_PROMPT_CHARS:,}"]
    assert link.prompt is None and link.method == "eagle2" and link.settings == {"seed": 5}


def test_the_app_limits_refuse_a_prompt_first():
    link, problems = parse(f"prompt={'a' * 1_000}", Limits(max_prompt_tokens=10))
    assert problems == ["the prompt is 1,000 characters; this app accepts prompts of up to 10 tokens"]


@pytest.mark.parametrize("prompt", ["<script>alert(1)</script>", "<img src=x onerror=alert(1)>",
                                    "go to javascript:alert(1)"])
def test_a_prompt_with_script_is_kept_as_text_and_said_so(prompt):
    link, problems = LinkState.parse({"prompt": prompt, "method": "<script>alert(2)</script>"})
    assert link.prompt == prompt and link.method is None
    assert problems == ["the prompt holds script-like markup: it is kept as plain text and never run",
                        "method must be one of ar, medusa, hydra, eagle1, eagle2, gumiho, mjsd, lookup, recycle, "
                        "got '<script>alert(2)</script>'"]


def test_a_prompt_about_code_is_not_taken_for_script():
    assert parse("prompt=Write+a+loop+where+one+%3D+1+and+onset%3D2")[1] == []
