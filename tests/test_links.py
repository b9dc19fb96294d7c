"""Durable links without a browser: the link format (what a link asks for, and a link from a state), then the
page's handlers of links on recorded traces and a tiny engine."""

from __future__ import annotations

from types import SimpleNamespace
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


def test_gradio_s_own_parameters_are_not_the_link_s():
    assert parse("__theme=dark&tab=race") == (LinkState(tab="race"), [])


# The page's handlers ---------------------------------------------------------------------------------------------


def page_with(loader, examples=()):
    """The app's page, and its LinkEvents (through the function behind its load event)."""
    from app.layout import build_app
    from app.link_events import LinkEvents

    demo = build_app(loader, Limits(max_run_seconds=30), list(examples))
    return next(f.fn.__self__ for f in demo.fns.values() if isinstance(getattr(f.fn, "__self__", None), LinkEvents))


def no_engine():
    from app.service import EngineLoader
    from gumiho.errors import GumihoError

    def fail(report):
        raise GumihoError("no model here")
    return EngineLoader(fail).load()


def request(query: str, session: str = "links") -> SimpleNamespace:
    return SimpleNamespace(session_hash=session, query_params=dict(parse_qsl(query)))


def inputs(events, values: dict) -> list:
    """Explore's inputs, then Race's, as the page holds them after `values` (updates as dicts or plain values)."""
    def current(box):
        value = values.get(box, box.value)
        return value.get("value", box.value) if isinstance(value, dict) else value
    fields = events.parts.explore_fields | {f"race.{n}": box for n, box in events.parts.race_fields.items()}
    return [current(box) for box in fields.values()]


@pytest.fixture
def example(tmp_path):
    from app.examples import Example

    from .app_traces import ar_trace, gumiho_trace

    traces = (gumiho_trace(), ar_trace())
    for trace in traces:
        (tmp_path / f"{trace.method}.json").write_text(trace.to_json())
    return Example(name="ex", folder=tmp_path, traces=traces)


def test_an_example_link_clamps_its_cycle_and_says_what_it_left_out(example):
    from app.figures import LARGE

    events = page_with(no_engine(), [example])
    explore, asked = events.handlers.explore, request("example=ex&method=eagle2&cycle=99&present=1")
    values = events.restore(False, "gumiho", asked)
    assert values[events.parts.note] == (
        "Opened the recorded Gumiho run of “Say something”, cycle 1. ⚠ Left out: the example has no recorded "
        "EAGLE\\-2 run; cycle 99 is beyond this run \\(cycles 0 to 1\\): it shows cycle 1.")
    assert values[explore.pick] == "ex/gumiho" and values[explore.cycle].value == 1
    assert values[events.presenter.toggle] is True and events.handlers.presenters.style(asked) is LARGE
    assert values[explore.tree].layout.font.size == 18
    assert events.rerun_flag not in values, "a recorded run is not run again"


def test_copy_link_names_the_example_or_the_settings_the_method_uses(example, monkeypatch):
    events = page_with(no_engine(), [example])
    explore = [box.value for box in events.parts.explore_fields.values()]
    box = events.parts.explore_link
    assert events.explore_link("ex/gumiho", 1.0, True, *explore)[box].value == (
        "?tab=explore&example=ex&method=gumiho&cycle=1&present=1")
    fields = dict(zip(events.parts.explore_fields, explore)) | {"prompt": "Hi <b>", "method": "eagle2", "seed": 7}
    monkeypatch.setenv("SPACE_ID", "owner/gumiho")
    link = events.explore_link(None, 0, False, *fields.values())[box].value
    assert link.startswith("https://huggingface.co/spaces/owner/gumiho?tab=explore&method=eagle2&cycle=0"
                           "&prompt=Hi+%3Cb%3E&")
    assert "seed=7" in link and "top_k=" in link and "mlptopk" not in link, "EAGLE-2 takes no mlptopk"
    race = dict(zip(events.parts.race_fields, [b.value for b in events.parts.race_fields.values()]))
    race |= {"prompt": "x" * 3000}
    updates = events.race_link(None, False, *race.values())
    assert "prompt=" not in updates[events.parts.race_link].value and "methods=eagle2%2Cgumiho" in updates[
        events.parts.race_link].value
    assert "It leaves out: the prompt is 3,000 characters" in updates[events.handlers.racing.message]


def test_a_live_link_reruns_through_generate_with_its_seed_then_shows_its_cycle(monkeypatch, tmp_path):
    from app.service import EngineLoader
    from gumiho.engine import Engine

    from .conftest import random_drafter, tiny_target, use_cache

    def tiny_engine(report) -> Engine:
        target = tiny_target()
        return Engine(target, {m: random_drafter(m, target) for m in ("eagle2", "gumiho")})

    use_cache(monkeypatch, tmp_path)
    events = page_with(EngineLoader(tiny_engine).load())
    explore, asked = events.handlers.explore, request("prompt=w1+w2+w3+w1+w2&method=eagle2&seed=3&max_new_tokens=8"
                                                      "&top_k=2&cycle=1&methods=medusa,eagle2")
    values = events.restore(False, "gumiho", asked)
    assert values[events.parts.note] == (
        "Opened a link to a live run: the page runs it again with EAGLE\\-2, with the link's settings and seed 3. "
        "⚠ Left out: Medusa is not loaded on this server.")
    assert values[events.rerun_flag] is True
    assert events.handlers.status("eagle2", values[events.handlers.pinned]).get(explore.tree_fields["top_k"]) is None
    rerun = values[events.rerun_state]
    assert events.reserve(rerun, asked) == {explore.message: "Waiting for the engine…"}
    updates = list(events.rerun(rerun, asked, *inputs(events, values)))
    trace = [u[explore.trace] for u in updates if explore.trace in u][-1]
    assert (trace.method, trace.prompt, trace.settings.seed, trace.settings.tree["top_k"]) == (
        "eagle2", "w1 w2 w3 w1 w2", 3, 2)
    assert "Done." in [u.get(explore.message) for u in updates]
    assert updates[-1][explore.cycle].value == 1 and updates[-1][explore.cycle_info].startswith("**Cycle 1**")
