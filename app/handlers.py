"""Event handlers: a visitor's input -> engine runs (through `service`) -> component values (through `views`).

Each handler returns (or yields) a dict keyed by the components it changes; the rest of the page stays as it was.
Input is checked by `validate` before anything runs: a value out of range becomes a message on the page, a value
of the wrong type (only an API call can send one) a `gr.Error` for the caller. Nothing a visitor sends can take
the app down, and no exception text reaches the page.
"""

from __future__ import annotations

import html
import logging
import time
from collections.abc import Callable, Collection, Iterator
from contextlib import closing
from dataclasses import dataclass, field, fields
from typing import Any

import gradio as gr
import plotly.graph_objects as go

from gumiho.errors import GumihoError
from gumiho.trace import GenerationTrace

from . import figures, gpu, render, validate
from .render import is_reference
from .examples import Example
from .figures import NORMAL, FigureStyle
from .present import Presenters
from .service import (
    TREE_FIELDS_USED,
    Control,
    EngineLoader,
    RunSettings,
    Sessions,
    race_order,
    race_settings,
    save_traces,
)
from .style import method_name
from .theory import Chain
from .validate import InvalidInput, Limits, WrongType
from .views import CycleView, ExploreView, ProgressView, RaceView, showcase_index

log = logging.getLogger(__name__)

STREAM_EVERY_S = 0.3  # an Explore run's text and caption
FIGURE_EVERY_S = 1.0  # its tree and paths table (figures are the heavy part of an update)
RACE_EVERY_S = 1.0  # a race's progress line and texts; its figures come once the race has ended
PLAY, PAUSE = "▶ Play", "⏸ Pause"
STOPPED_IN_QUEUE = "Stopped before it started (it was waiting for the engine)."
BUSY = "A run is in progress: Stop it first."
Component = gr.components.Component


def failure(exc: Exception) -> str:
    """The visible message for an exception: the visitor's mistake as is (escaped), ZeroGPU's refusal as where to
    go instead, anything else as a short apology (the exception goes to the log, not to the page)."""
    if gpu.quota_exhausted(exc):
        log.info("ZeroGPU refused a call: %s", exc)
        message = f"⚠ {gpu.QUOTA_NOTE}"
    elif isinstance(exc, GumihoError):
        message = f"⚠ {html.escape(str(exc), quote=False)}"
    else:
        log.exception("handler failed")
        message = "⚠ Something went wrong. The app is still running: try again."
    gr.Warning(message.removeprefix("⚠ "))
    return message


def refuse(endpoint: str, exc: WrongType) -> gr.Error:
    """An API call with a value of the wrong type: one log line, and the reason for the caller."""
    log.warning("refused a call to %s: %s", endpoint, exc)
    return gr.Error(html.escape(str(exc), quote=False), print_exception=False)


def ending(control: Control, trace: GenerationTrace | None, limits: Limits, done: bool) -> str:
    if control.out_of_time:
        return f"Stopped: time budget ({limits.max_run_seconds:g} s)."
    return "Done." if done and trace is not None and trace.finish_reason != "stopped" else "Stopped."


@dataclass
class Parts:
    """A tab's components that handlers write to."""

    def all(self) -> list[Component]:
        return [getattr(self, f.name) for f in fields(self) if isinstance(getattr(self, f.name), Component)]


@dataclass
class ExploreParts(Parts):
    message: gr.Markdown
    summary: gr.Markdown
    legend: gr.HTML
    output: gr.HTML
    cycle: gr.Slider
    cycle_info: gr.Markdown
    tree: gr.Plot
    paths: gr.Dataframe
    trace: gr.State
    pick: gr.Dropdown
    download: gr.DownloadButton
    playing: gr.State
    play_timer: gr.Timer
    play: gr.Button
    tree_fields: dict[str, Component]

    def shown(self) -> list[Component]:
        """What showing a trace changes (the outputs of Generate, Replay and the examples), the file last."""
        return [self.message, self.summary, self.legend, self.output, self.cycle, self.cycle_info, self.tree,
                self.paths, self.trace, self.pick, self.download]

    def player(self) -> list[Component]:
        return [self.cycle, self.output, self.cycle_info, self.tree, self.paths, self.playing, self.play_timer,
                self.play]

    def cycle_values(self, view: CycleView) -> dict:
        return {self.output: view.output, self.cycle_info: view.caption, self.tree: view.tree, self.paths: view.paths}

    def progress(self, view: ProgressView) -> dict:
        return {self.summary: view.summary, self.output: view.output, self.cycle_info: view.caption,
                self.cycle: gr.Slider(maximum=max(view.cycles - 1, 1), value=max(view.cycles - 1, 0))}

    def values(self, view: ExploreView, trace: GenerationTrace | None) -> dict:
        return {self.summary: view.summary, self.legend: view.legend, self.trace: trace,
                self.cycle: gr.Slider(maximum=view.slider_max, value=view.cycle), **self.cycle_values(view.detail)}

    def playback(self, running: bool) -> dict:
        return {self.playing: running, self.play_timer: gr.Timer(active=running),
                self.play: gr.Button(PAUSE if running else PLAY)}


@dataclass
class RaceParts(Parts):
    message: gr.Markdown
    headline: gr.Markdown
    table: gr.Dataframe
    timeline: gr.Plot
    tau: gr.Plot
    timing: gr.Plot
    texts: gr.HTML
    traces: gr.State
    pick: gr.Dropdown
    files: gr.File
    top_k: gr.Slider
    total_tokens: gr.Slider

    def shown(self) -> list[Component]:
        return [self.message, self.headline, self.table, self.timeline, self.tau, self.timing, self.texts,
                self.traces, self.pick, self.files]

    def values(self, traces: list[GenerationTrace], style: FigureStyle = NORMAL) -> dict:
        view = RaceView.of(traces, style)
        return {self.headline: view.headline, self.table: view.table, self.timeline: view.timeline,
                self.tau: view.tau, self.timing: view.timing, self.texts: view.texts, self.traces: traces}


@dataclass
class Handlers:
    """Event handlers; the loader and the sessions are shared by every visitor, the rest is per visitor."""

    loader: EngineLoader
    sessions: Sessions
    examples: list[Example]
    limits: Limits
    explore: ExploreParts
    racing: RaceParts
    status_line: gr.Markdown
    status_timer: gr.Timer
    pinned: gr.State | None = None  # the names of the settings a link set (see `status`)
    presenters: Presenters = field(default_factory=Presenters)

    def __post_init__(self) -> None:
        gpu.serve(self.loader)

    def status(self, method: str, pinned: Collection[str] = ()) -> dict:
        """The loading line; once the engine is ready, the tree panels get the defaults of its device, except the
        settings a link set (`pinned`: names of `explore.tree_fields`, "race.top_k", "race.total_tokens")."""
        values = {self.status_line: self.loader.status(), self.status_timer: gr.Timer(active=not self.loader.ready)}
        if self.loader.ready and not self.loader.error:
            shared = self.loader.default_tree("gumiho").to_dict()
            race = {"race.top_k": self.racing.top_k, "race.total_tokens": self.racing.total_tokens}
            kept = {box for name, box in (self.explore.tree_fields | race).items() if name in pinned}
            values |= self.method_defaults(method) | {self.racing.top_k: shared["top_k"],
                                                      self.racing.total_tokens: shared["total_tokens"]}
            values = {box: value for box, value in values.items() if box not in kept}
        return values

    def _turn(self, message: gr.Markdown, control: Control) -> Iterator[dict]:
        """Waits for the model to load, yielding progress; then, if Stop came while the run waited in the queue,
        says so (the caller ends when `control.stopped`)."""
        while self.loader.wait(timeout=1.0) is None:
            yield {message: f"Waiting for the model to finish loading ({self.loader.phase})…"}
        if control.stopped:
            yield {message: STOPPED_IN_QUEUE}

    def queue(self, request: gr.Request) -> str:
        """First step of Generate and Race: from here on the run waits for the engine, and Stop can cancel it.
        A visitor gets one run at a time (a second click would only wait behind the first, unexplained)."""
        if self.sessions.busy(request.session_hash):
            raise gr.Error(BUSY, print_exception=False)
        self.sessions.reserve(request.session_hash)
        return "Waiting for the engine…"

    def stop(self, request: gr.Request) -> str:
        if self.sessions.stop(request.session_hash):
            return "Stopping after the current cycle…"
        return "Nothing is running."

    def range_check(self, name: str, message: gr.Markdown) -> Callable[[Any], dict]:
        """A handler for a number box while it is typed in: a value out of range gets a message (the page sets the
        box to the nearest allowed value when it loses focus)."""
        allowed = self.limits.range(name)

        def check(value: Any) -> dict:
            try:
                validate.number(allowed, value)
            except InvalidInput as exc:
                return {message: f"⚠ {html.escape(str(exc), quote=False)}; it is set to the nearest allowed value."}
            return {message: gr.skip()}
        return check

    # Explore ---------------------------------------------------------------------------------------------------

    def generate(self, prompt: Any, method: Any, temperature: Any, max_new_tokens: Any, top_p: Any, seed: Any,
                 top_k: Any, depth: Any, total_tokens: Any, mlptopk: Any, pruning: Any, fta: Any, tau_acc: Any,
                 request: gr.Request) -> Iterator[dict]:
        ui = self.explore
        with self.sessions.control(request.session_hash) as control:  # taken first: a refusal must free it too
            try:
                prompt, method = validate.prompt(prompt, self.limits), validate.method(method)
                settings = RunSettings(**validate.numbers(
                    self.limits, max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, seed=seed,
                    top_k=top_k, depth=depth, total_tokens=total_tokens, mlptopk=mlptopk, pruning=pruning,
                    tau_acc=tau_acc), fta=validate.flag("fta", fta))
            except WrongType as exc:
                raise refuse("/generate", exc) from None
            except InvalidInput as exc:
                yield {ui.message: failure(exc)}
                return
            try:
                yield from self._turn(ui.message, control)
                if control.stopped:
                    return
                config = settings.config(method, self.loader.default_tree(method))
                yield {ui.message: f"Generating with {method_name(method)}…", ui.pick: None}
                trace, drawn, style = None, 0.0, self.presenters.style(request)
                run = gpu.generate_traces(prompt, method, config, self.limits, control, STREAM_EVERY_S)
                with closing(run) as updates:
                    for trace in updates:
                        if time.monotonic() - drawn >= FIGURE_EVERY_S:
                            drawn = time.monotonic()
                            yield ui.values(ExploreView.of(trace, style=style), trace)
                        else:
                            yield ui.progress(ProgressView.of(trace))
                yield {ui.message: ending(control, trace, self.limits, done=True),
                       **ui.values(ExploreView.of(trace, style=style), trace), ui.download: save_traces([trace])[0]}
            except Exception as exc:
                yield {ui.message: failure(exc)}

    def show_cycle(self, trace: GenerationTrace | None, cycle: float, request: gr.Request | None = None) -> dict:
        if trace is None or not trace.steps:
            return {self.explore.cycle_info: gr.skip()}  # an empty dict would read as one value
        try:
            return self.explore.cycle_values(CycleView.of(trace, int(cycle), self.presenters.style(request)))
        except Exception as exc:  # the message goes where the cycle's caption would
            return {self.explore.cycle_info: failure(exc)}

    def toggle_play(self, playing: bool, trace: GenerationTrace | None, cycle: float) -> dict:
        """Start or pause stepping through the cycles; starting at the end starts over."""
        steps = len(trace.steps) if trace else 0
        if playing or steps < 2:
            return self.explore.playback(False)
        start = 0 if int(cycle) >= steps - 1 else int(cycle)
        return self.explore.playback(True) | {self.explore.cycle: start}

    def tick(self, trace: GenerationTrace | None, cycle: float, request: gr.Request | None = None) -> dict:
        ui = self.explore
        steps = len(trace.steps) if trace else 0
        if steps == 0:
            return ui.playback(False)
        k = min(int(cycle) + 1, steps - 1)
        try:
            view = ui.cycle_values(CycleView.of(trace, k, self.presenters.style(request)))
        except Exception as exc:
            return ui.playback(False) | {ui.cycle_info: failure(exc)}
        return {ui.cycle: k, **view, **ui.playback(k < steps - 1)}

    def pick_example(self, key: str, request: gr.Request | None = None) -> dict:
        ui = self.explore
        name, _, method = (key or "").partition("/")
        example = next((e for e in self.examples if e.name == name), None)
        if example is None or method not in {t.method for t in example.traces}:
            return {ui.message: "⚠ No such example."}
        trace = example.trace(method)
        view = ExploreView.of(trace, showcase_index(trace), self.presenters.style(request))
        return {ui.message: "", **ui.values(view, trace),
                ui.download: str(example.path(method))}

    def upload(self, path: Any, request: gr.Request | None = None) -> dict:
        ui = self.explore
        try:
            if not path:
                raise InvalidInput("no file received")
            trace = validate.trace_file(path)
        except WrongType as exc:
            raise refuse("/replay", exc) from None
        except InvalidInput as exc:
            return {ui.message: failure(exc)}
        note = f"Replaying the uploaded trace of {method_name(trace.method)}."
        return {ui.message: note, **ui.values(ExploreView.of(trace, style=self.presenters.style(request)), trace),
                ui.pick: None}

    def method_defaults(self, method: str) -> dict:
        """The method's default tree in the advanced panel; fields it does not use keep their value, greyed out."""
        used = TREE_FIELDS_USED.get(method, ())
        defaults = self.loader.default_tree(method).to_dict() if used else {}
        return {box: gr.update(value=defaults[name], interactive=True) if name in used else gr.update(interactive=False)
                for name, box in self.explore.tree_fields.items()}

    # Race ------------------------------------------------------------------------------------------------------

    def race(self, prompt: Any, methods: Any, temperature: Any, max_new_tokens: Any, top_k: Any, total_tokens: Any,
             fta: Any, request: gr.Request) -> Iterator[dict]:
        ui = self.racing
        with self.sessions.control(request.session_hash) as control:  # taken first: a refusal must free it too
            try:
                prompt, methods = validate.prompt(prompt, self.limits), validate.race_methods(methods)
                settings = RunSettings(**validate.numbers(self.limits, max_new_tokens=max_new_tokens,
                                                          temperature=temperature, top_k=top_k,
                                                          total_tokens=total_tokens), fta=validate.flag("fta", fta))
            except WrongType as exc:
                raise refuse("/race", exc) from None
            except InvalidInput as exc:
                yield {ui.message: failure(exc)}
                return
            try:
                yield from self._turn(ui.message, control)
                if control.stopped:
                    return
                configs = {m: s.config(m, self.loader.default_tree(m))
                           for m, s in race_settings(settings, methods).items()}
                yield {ui.pick: None}
                traces: list[GenerationTrace] = []
                runs = gpu.race_traces(prompt, configs, self.limits, control, RACE_EVERY_S)
                with closing(runs) as updates:
                    for traces in updates:  # the text only while a method is timed; the figures at the end
                        running = method_name(traces[-1].method)
                        yield {ui.message: f"Racing: {running} ({len(traces)} of {len(configs) + 1}), "
                                           f"{traces[-1].new_tokens} tokens…",
                               ui.texts: render.race_texts_html([t for t in traces if not is_reference(t)])}
                engine_traces = [t for t in traces if not is_reference(t)]  # a replayable trace is an engine's
                finished = len(engine_traces) == len(configs)
                yield {ui.message: ending(control, engine_traces[-1] if engine_traces else None, self.limits,
                                          finished),
                       **ui.values(traces, self.presenters.style(request)), ui.files: save_traces(engine_traces)}
            except Exception as exc:
                yield {ui.message: failure(exc)}

    def pick_race(self, name: str, request: gr.Request | None = None) -> dict:
        ui = self.racing
        example = next((e for e in self.examples if e.name == name), None)
        if example is None:
            return {ui.message: "⚠ No such example."}
        return {ui.message: "", **ui.values(list(example.traces), self.presenters.style(request)),
                ui.files: [str(example.path(t.method)) for t in example.traces]}

    def race_upload(self, paths: list[str] | None, request: gr.Request | None = None) -> dict:
        ui = self.racing
        try:
            traces = [validate.trace_file(p) for p in paths or []]
            methods = [t.method for t in traces]
            if not traces or len(set(methods)) != len(methods):
                raise InvalidInput("upload trace files of one run each, at most one per method")
        except InvalidInput as exc:
            return {ui.message: failure(exc)}
        order = race_order(methods)
        traces.sort(key=lambda t: order.index(t.method))
        return {ui.message: "Replaying the uploaded traces.", **ui.values(traces, self.presenters.style(request)),
                ui.pick: None}


def tau_calculator(text: str) -> tuple[str, go.Figure | Any]:
    """The lesson's calculator: τ for a chain of acceptance probabilities, and where improving one pays most."""
    try:
        chain = Chain.parse(text)
    except ValueError as exc:
        return f"⚠ {html.escape(str(exc), quote=False)}", gr.skip()
    terms, grads = chain.terms(), chain.gradient()
    best = max(range(len(grads)), key=grads.__getitem__) + 1
    summary = (f"**τ_draft = {chain.tau:.3f}** accepted draft tokens per cycle, so **{1 + chain.tau:.3f}** tokens "
               f"per target forward. Raising p_k by 0.01 adds about 0.01 × ∂τ/∂p_k; the best position to "
               f"improve here is **k = {best}** (∂τ/∂p = {grads[best - 1]:.2f}).")
    return summary, figures.chain_figure(terms, grads)
