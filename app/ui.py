"""The page: Blocks layout and event wiring.

Handlers turn a visitor's input into engine runs (through `service`) and traces into component values (through
`figures` and `render`). Every handler reports bad input as a visible message and leaves the rest of the page as
it was; nothing a visitor sends can take the app down.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import closing
from dataclasses import dataclass

import gradio as gr
import pandas as pd
import plotly.graph_objects as go

from gumiho.errors import GumihoError
from gumiho.trace import CycleTrace, GenerationTrace, TraceError

from . import figures, render
from .bench import QUICK_COMMAND, acceptance_rows, read_runs, task_rows
from .examples import PROMPTS, Example, load_examples
from .lesson import lesson_parts
from .service import (
    MAX_NEW_TOKENS,
    RACE_ORDER,
    Control,
    EngineLoader,
    RunSettings,
    Sessions,
    race,
    race_settings,
    read_trace,
    save_traces,
    follow,
    stream,
    tree_defaults,
)
from .style import CSS, method_name
from .theory import Chain

log = logging.getLogger(__name__)

STREAM_EVERY_S = 0.3
RACE_EVERY_S = 1.0
PLAY_EVERY_S = 0.9
PLAY, PAUSE = "▶ Play", "⏸ Pause"
STOPPED_IN_QUEUE = "Stopped before it started (it was waiting for the engine)."
LATEX = [{"left": "$$", "right": "$$", "display": True}, {"left": "$", "right": "$", "display": False}]
METHOD_CHOICES = [("Gumiho", "gumiho"), ("EAGLE-2", "eagle2"), ("AR (no drafting)", "ar")]
TREE_FIELDS = ("top_k", "depth", "total_tokens", "mlptopk", "pruning", "fta")
EXPLORE_VIEW = 7  # summary, legend, output, slider, cycle caption, tree, paths
RACE_VIEW = 6  # headline, table, timeline, tau, timing, texts


def failure(exc: Exception) -> str:
    """The visible message for an exception: the user's mistake as is, anything else as a short apology."""
    if isinstance(exc, (GumihoError, TraceError)):
        message = f"⚠ {exc}"
    else:
        log.exception("handler failed")
        message = f"⚠ Something went wrong ({type(exc).__name__}: {exc}). The app is still running: try again."
    gr.Warning(message.removeprefix("⚠ "))
    return message


def skips(n: int) -> list:
    return [gr.skip() for _ in range(n)]


# ---------------------------------------------------------------------------------------------- views


@dataclass
class CycleView:
    """One cycle of a trace: the output with that cycle outlined, a caption, the tree and the candidate paths."""

    output: str
    caption: str
    tree: go.Figure
    paths: pd.DataFrame

    @classmethod
    def of(cls, trace: GenerationTrace | None, k: int) -> CycleView:
        if trace is None:
            return cls(render.EMPTY_OUTPUT, "", figures.empty_figure("no trace yet"), render.empty_paths_table())
        if not trace.steps:
            note = "This trace has no recorded cycles (it was recorded without the tree; use `--trace`)."
            return cls(render.output_html(trace), note, figures.empty_figure("no cycles recorded"),
                       render.empty_paths_table())
        step = trace.steps[k]
        return cls(render.output_html(trace, selected=k), render.cycle_markdown(step), figures.tree_figure(step),
                   render.paths_table(step))

    def values(self) -> list:
        return [self.output, self.caption, self.tree, self.paths]


@dataclass
class ExploreView:
    """Everything the Explore tab shows for a trace."""

    summary: str
    legend: str
    cycles: int
    cycle: int
    detail: CycleView

    @classmethod
    def of(cls, trace: GenerationTrace | None, cycle: int | None = None) -> ExploreView:
        """`cycle` None shows the last cycle."""
        if trace is None:
            return cls("Generate something, or replay a trace.", "", 0, 0, CycleView.of(None, 0))
        n = len(trace.steps)
        k = n - 1 if cycle is None else int(cycle)
        k = min(max(k, 0), max(n - 1, 0))
        return cls(render.trace_summary(trace), render.legend_html(trace), n, k, CycleView.of(trace, k))

    def slider(self) -> gr.Slider:
        return gr.Slider(minimum=0, maximum=max(self.cycles - 1, 1), value=self.cycle, step=1)

    def values(self) -> list:
        """In the order of the Explore outputs: summary, legend, output, slider, caption, tree, paths."""
        output, caption, tree, paths = self.detail.values()
        return [self.summary, self.legend, output, self.slider(), caption, tree, paths]


def race_view(traces: list[GenerationTrace]) -> list:
    return [render.race_headline(traces), render.race_table(traces), figures.race_timeline_figure(traces),
            figures.race_tau_figure(traces), figures.race_timing_figure(traces), render.race_texts_html(traces)]


def showcase_cycle(trace: GenerationTrace) -> CycleTrace | None:
    """The most instructive cycle: longest acceptance, then the most FTA-borrowed positions, then the biggest tree."""
    def key(cycle: CycleTrace) -> tuple:
        borrowed = sum(sum(p.filled) for p in cycle.paths)
        return cycle.accept_length, borrowed, len(cycle.nodes), -cycle.index
    return max(trace.steps, key=key, default=None)


def showcase_index(trace: GenerationTrace) -> int | None:
    """The showcase cycle's index (None: the last cycle), for opening a recorded run where something happens."""
    cycle = showcase_cycle(trace)
    return cycle.index if cycle else None


# ---------------------------------------------------------------------------------------------- handlers


@dataclass
class Handlers:
    """Event handlers; the loader and the sessions are shared by every visitor, the rest is per visitor."""

    loader: EngineLoader
    sessions: Sessions
    examples: list[Example]

    def status(self) -> list:
        return [self.loader.status(), gr.Timer(active=not self.loader.ready)]

    def _turn(self, control: Control, width: int) -> Iterator[list]:
        """Waits for the model to load, yielding progress; then, if Stop came while the run waited in the queue,
        says so (the caller ends when `control.stopped`)."""
        while self.loader.wait(timeout=1.0) is None:
            yield [f"Waiting for the model to finish loading ({self.loader.phase})…", *skips(width)]
        if control.stopped:
            yield [STOPPED_IN_QUEUE, *skips(width)]

    # Explore ---------------------------------------------------------------------------------------------------

    def generate(self, prompt: str, method: str, temperature: float, max_new_tokens: float, top_p: float,
                 seed: float, top_k: float, depth: float, total_tokens: float, mlptopk: float, pruning: float,
                 fta: bool, request: gr.Request) -> Iterator[list]:
        width = EXPLORE_VIEW + 2
        with self.sessions.control(request.session_hash) as control:
            try:
                settings = RunSettings(max_new_tokens=int(max_new_tokens), temperature=float(temperature),
                                       top_p=float(top_p), seed=int(seed), top_k=int(top_k), depth=int(depth),
                                       total_tokens=int(total_tokens), mlptopk=int(mlptopk), pruning=int(pruning),
                                       fta=bool(fta))
                config = settings.config(method)
                yield from self._turn(control, width)
                if control.stopped:
                    return
                engine = self.loader.engine
                yield [f"Generating with {method_name(method)}…", *skips(width)]
                trace = None
                with closing(follow(stream(engine, prompt, method, config, control), STREAM_EVERY_S,
                                    control.stop)) as updates:
                    for trace in updates:
                        yield ["", *ExploreView.of(trace).values(), trace, gr.skip()]
                done = f"Done: {render.trace_summary(trace)}" if trace.finish_reason != "stopped" else "Stopped."
                yield [done, *ExploreView.of(trace).values(), trace, save_traces([trace])[0]]
            except Exception as exc:
                yield [failure(exc), *skips(width)]

    def queue(self, request: gr.Request) -> str:
        """First step of Generate and Race: from here on the run waits for the engine, and Stop can cancel it."""
        self.sessions.reserve(request.session_hash)
        return "Waiting for the engine…"

    def stop(self, request: gr.Request) -> str:
        if self.sessions.stop(request.session_hash):
            return "Stopping after the current cycle…"
        return "Nothing is running."

    def show_cycle(self, trace: GenerationTrace | None, cycle: float) -> list:
        if trace is None or not trace.steps:
            return skips(4)
        try:
            return CycleView.of(trace, min(max(int(cycle), 0), len(trace.steps) - 1)).values()
        except Exception as exc:  # the message goes where the cycle's caption would
            return [gr.skip(), failure(exc), gr.skip(), gr.skip()]

    def toggle_play(self, playing: bool, trace: GenerationTrace | None, cycle: float) -> list:
        """Start or pause stepping through the cycles; starting at the end starts over."""
        steps = len(trace.steps) if trace else 0
        if playing or steps < 2:
            return [False, gr.Timer(active=False), gr.Button(PLAY), gr.skip()]
        start = 0 if int(cycle) >= steps - 1 else int(cycle)
        return [True, gr.Timer(active=True), gr.Button(PAUSE), start]

    def tick(self, trace: GenerationTrace | None, cycle: float) -> list:
        steps = len(trace.steps) if trace else 0
        if steps == 0:
            return [gr.skip(), *skips(4), False, gr.Timer(active=False), gr.Button(PLAY)]
        k = min(int(cycle) + 1, steps - 1)
        try:
            view = CycleView.of(trace, k).values()
        except Exception as exc:
            return [gr.skip(), gr.skip(), failure(exc), gr.skip(), gr.skip(), False, gr.Timer(active=False),
                    gr.Button(PLAY)]
        running = k < steps - 1
        return [k, *view, running, gr.Timer(active=running), gr.Button(PAUSE if running else PLAY)]

    def pick_example(self, key: str) -> list:
        name, _, method = (key or "").partition("/")
        example = next((e for e in self.examples if e.name == name), None)
        if example is None:
            return ["⚠ No such example.", *skips(EXPLORE_VIEW + 2)]
        trace = example.trace(method)
        return ["", *ExploreView.of(trace, showcase_index(trace)).values(), trace, str(example.path(method))]

    def upload(self, path: str | None) -> list:
        try:
            if not path:
                raise TraceError("no file received")
            trace = read_trace(path)
            note = f"Replaying the uploaded trace of {method_name(trace.method)}."
            return [note, *ExploreView.of(trace).values(), trace, gr.skip()]
        except Exception as exc:
            return [failure(exc), *skips(EXPLORE_VIEW + 2)]

    def method_defaults(self, method: str) -> list:
        """The method's default tree in the advanced panel; fields it does not use keep their value, greyed out."""
        used = {"gumiho": TREE_FIELDS, "eagle2": ("top_k", "depth", "total_tokens")}.get(method, ())
        defaults = tree_defaults(method) if used else {}
        return [gr.update(value=defaults[name], interactive=True) if name in used else gr.update(interactive=False)
                for name in TREE_FIELDS]

    # Race ------------------------------------------------------------------------------------------------------

    def race(self, prompt: str, temperature: float, max_new_tokens: float, top_k: float, total_tokens: float,
             fta: bool, request: gr.Request) -> Iterator[list]:
        width = RACE_VIEW + 2
        with self.sessions.control(request.session_hash) as control:
            try:
                settings = RunSettings(max_new_tokens=int(max_new_tokens), temperature=float(temperature),
                                       top_k=int(top_k), total_tokens=int(total_tokens), fta=bool(fta))
                configs = {m: s.config(m) for m, s in race_settings(settings).items()}
                yield from self._turn(control, width)
                if control.stopped:
                    return
                engine = self.loader.engine
                traces: list[GenerationTrace] = []
                with closing(follow(race(engine, prompt, configs, control), RACE_EVERY_S, control.stop)) as updates:
                    for traces in updates:
                        running = method_name(traces[-1].method)
                        yield [f"Racing: {running} ({len(traces)} of {len(RACE_ORDER)})…", *race_view(traces),
                               traces, gr.skip()]
                finished = len(traces) == len(RACE_ORDER) and traces[-1].finish_reason != "stopped"
                yield ["Done." if finished else "Stopped.", *race_view(traces), traces, save_traces(traces)]
            except Exception as exc:
                yield [failure(exc), *skips(width)]

    def pick_race(self, name: str) -> list:
        example = next((e for e in self.examples if e.name == name), None)
        if example is None:
            return ["⚠ No such example.", *skips(RACE_VIEW + 2)]
        return ["", *race_view(list(example.traces)), list(example.traces),
                [str(example.path(t.method)) for t in example.traces]]

    def race_upload(self, paths: list[str] | None) -> list:
        try:
            traces = [read_trace(p) for p in paths or []]
            methods = [t.method for t in traces]
            if not traces or len(set(methods)) != len(methods):
                raise TraceError("upload one to three trace files, at most one per method")
            traces.sort(key=lambda t: RACE_ORDER.index(t.method))
            return ["Replaying the uploaded traces.", *race_view(traces), traces, gr.skip()]
        except Exception as exc:
            return [failure(exc), *skips(RACE_VIEW + 2)]

    # How it works ----------------------------------------------------------------------------------------------

    def tau_calculator(self, text: str) -> list:
        try:
            chain = Chain.parse(text)
        except ValueError as exc:
            return [f"⚠ {exc}", gr.skip()]
        terms, grads = chain.terms(), chain.gradient()
        best = max(range(len(grads)), key=grads.__getitem__) + 1
        summary = (f"**τ_draft = {chain.tau:.3f}** accepted draft tokens per cycle, so **{1 + chain.tau:.3f}** tokens "
                   f"per target forward. Raising p_k by 0.01 adds about 0.01 × ∂τ/∂p_k; the best position to "
                   f"improve here is **k = {best}** (∂τ/∂p = {grads[best - 1]:.2f}).")
        return [summary, figures.chain_figure(terms, grads)]


# ---------------------------------------------------------------------------------------------- layout


def _tree_inputs(method: str) -> list[gr.components.Component]:
    defaults = tree_defaults(method)
    return [
        gr.Slider(1, 10, value=defaults["top_k"], step=1, label="top-k (candidates per expanded node)"),
        gr.Slider(1, 8, value=defaults["depth"], step=1,
                  label="depth (EAGLE-2: expansions; Gumiho: draft depth − 1)"),
        gr.Slider(2, 64, value=defaults["total_tokens"], step=1, label="total tokens verified per cycle (root incl.)"),
        gr.Slider(1, 16, value=defaults["mlptopk"], step=1, label="Gumiho: mlptopk (candidates per MLP head)"),
        gr.Slider(1, 16, value=defaults["pruning"], step=1, label="Gumiho: pruning (nodes kept per MLP depth)"),
        gr.Checkbox(value=defaults["fta"], label="Gumiho: Full Tree Attention (approximate; greedy only)"),
    ]


def build_app(loader: EngineLoader, examples: list[Example] | None = None) -> gr.Blocks:
    """The whole page. It opens on the first recorded example, so it is populated before the model has loaded."""
    examples = load_examples() if examples is None else examples
    handlers = Handlers(loader, Sessions(), examples)
    first = examples[0] if examples else None
    explore_trace = first.trace("gumiho") if first and any(t.method == "gumiho" for t in first.traces) else (
        first.traces[0] if first else None)

    with gr.Blocks(title="Gumiho speculative decoding explorer", delete_cache=(3600, 3600)) as demo:
        gr.Markdown("# Gumiho: speculative decoding you can watch\n"
                    "A small drafter guesses several tokens as a tree; the target model checks the whole tree in "
                    "one forward pass and keeps the longest correct guess plus one token of its own. Pick a cycle to "
                    "see its tree, race the methods, or read *How it works*.")
        status = gr.Markdown(loader.status(), elem_classes="gm-status")
        status_timer = gr.Timer(1.0)
        status_timer.tick(handlers.status, outputs=[status, status_timer], concurrency_limit=None,
                          show_progress="hidden", api_visibility="private")

        with gr.Tabs():
            with gr.Tab("Explore"):
                with gr.Row():
                    with gr.Column(scale=3):
                        prompt = gr.Textbox(label="Prompt", lines=3,
                                            value=explore_trace.prompt if explore_trace else PROMPTS[0])
                        gr.Examples([[p] for p in PROMPTS], inputs=[prompt], label="Example prompts")
                    with gr.Column(scale=2):
                        method = gr.Radio(METHOD_CHOICES, value="gumiho", label="Method")
                        temperature = gr.Slider(0, 2, value=0, step=0.05, label="Temperature (0 = greedy)")
                        max_new = gr.Slider(1, MAX_NEW_TOKENS, value=64, step=1, label="Max new tokens")
                        with gr.Accordion("Advanced: sampling and draft tree", open=False):
                            top_p = gr.Slider(0.05, 1, value=1, step=0.05, label="top-p")
                            seed = gr.Number(value=0, precision=0, label="Seed")
                            tree = _tree_inputs("gumiho")
                with gr.Row():
                    generate_btn = gr.Button("Generate", variant="primary")
                    stop_btn = gr.Button("Stop", variant="stop")
                    download = gr.DownloadButton("Download trace (JSON)",
                                                 value=str(first.path(explore_trace.method)) if first else None)
                    upload = gr.UploadButton("Replay a trace (JSON)", file_types=[".json"])
                pick = gr.Dropdown([c for e in examples for c in e.choices()], label="Recorded examples",
                                   value=f"{first.name}/{explore_trace.method}" if first else None)
                view = ExploreView.of(explore_trace, showcase_index(explore_trace) if explore_trace else None)
                message = gr.Markdown(label="message")
                summary = gr.Markdown(view.summary, label="summary")
                legend = gr.HTML(view.legend, label="legend")
                output = gr.HTML(view.detail.output, label="output")
                with gr.Row(equal_height=True):
                    cycle = gr.Slider(0, max(view.cycles - 1, 1), value=view.cycle, step=1, scale=5,
                                      label="Cycle (one target forward each)")
                    play = gr.Button(PLAY, scale=1)
                cycle_info = gr.Markdown(view.detail.caption, label="cycle")
                tree_plot = gr.Plot(view.detail.tree, label="Draft tree")
                paths = gr.Dataframe(view.detail.paths, label="Candidate paths of this cycle", interactive=False,
                                     wrap=True)
                trace_state = gr.State(explore_trace)
                playing = gr.State(False)
                play_timer = gr.Timer(PLAY_EVERY_S, active=False)

            with gr.Tab("Race"):
                gr.Markdown("One prompt through **EAGLE-2, Gumiho and AR**, one after the other (never at the same "
                            "time, so the timings stay honest). EAGLE-2 and Gumiho get the same verification "
                            "budget: the same total tokens and top-k. The recorded races below were timed on a shared "
                            "2-core CPU, so their timings move with whatever else ran; race your own prompt to see "
                            "this machine now.")
                with gr.Row():
                    with gr.Column(scale=3):
                        race_prompt = gr.Textbox(label="Race prompt", lines=2,
                                                 value=first.prompt if first else PROMPTS[0])
                        gr.Examples([[p] for p in PROMPTS], inputs=[race_prompt], label="Example prompts")
                    with gr.Column(scale=2):
                        race_temperature = gr.Slider(0, 2, value=0, step=0.05, label="Temperature")
                        race_max_new = gr.Slider(1, MAX_NEW_TOKENS, value=64, step=1, label="Max new tokens")
                        race_top_k = gr.Slider(1, 10, value=tree_defaults("gumiho")["top_k"], step=1,
                                               label="top-k (both drafters)")
                        race_total = gr.Slider(2, 64, value=tree_defaults("gumiho")["total_tokens"], step=1,
                                               label="total tokens verified per cycle (both drafters)")
                        race_fta = gr.Checkbox(value=False, label="Gumiho: Full Tree Attention")
                with gr.Row():
                    race_btn = gr.Button("Race: EAGLE-2 → Gumiho → AR", variant="primary")
                    race_stop = gr.Button("Stop", variant="stop")
                    race_upload = gr.UploadButton("Replay traces (JSON, up to 3)", file_types=[".json"],
                                                  file_count="multiple")
                race_pick = gr.Dropdown([(e.prompt, e.name) for e in examples], label="Recorded races",
                                        value=first.name if first else None)
                recorded = list(first.traces) if first else []
                headline, table, timeline, tau, timing, texts = race_view(recorded)
                race_message = gr.Markdown(label="message")
                race_headline = gr.Markdown(headline, label="headline")
                race_table = gr.Dataframe(table, label="Headline numbers", interactive=False)
                race_timeline = gr.Plot(timeline, label="Tokens over time")
                race_tau = gr.Plot(tau, label="τ per cycle")
                race_timing = gr.Plot(timing, label="Time per cycle")
                race_texts = gr.HTML(texts, label="texts")
                race_files = gr.File([str(first.path(t.method)) for t in recorded] if first else None,
                                     label="Traces of this race (JSON)", file_count="multiple", interactive=False)
                race_state = gr.State(recorded)

            with gr.Tab("Benchmarks"), gr.Column(elem_id="gm-bench"):
                bench_refresh = gr.Button("Reload results", size="sm")

                gr.render(triggers=[demo.load, bench_refresh.click])(_benchmarks)

            with gr.Tab("How it works"):
                _lesson(handlers, examples)

        explore_outputs = [message, summary, legend, output, cycle, cycle_info, tree_plot, paths, trace_state,
                           download]
        race_outputs = [race_message, race_headline, race_table, race_timeline, race_tau, race_timing, race_texts,
                        race_state, race_files]
        engine_event = dict(concurrency_limit=1, concurrency_id="engine")
        queued = dict(concurrency_limit=None, show_progress="hidden", api_visibility="private")
        generate_btn.click(handlers.queue, None, [message], **queued).then(
            handlers.generate, [prompt, method, temperature, max_new, top_p, seed, *tree], explore_outputs,
            api_name="generate", show_progress="minimal", **engine_event)
        stop_btn.click(handlers.stop, outputs=[message], concurrency_limit=None, api_name="stop")
        method.change(handlers.method_defaults, [method], tree, api_visibility="private")
        cycle.input(handlers.show_cycle, [trace_state, cycle], [output, cycle_info, tree_plot, paths],
                    trigger_mode="always_last", show_progress="hidden", api_visibility="private")
        play.click(handlers.toggle_play, [playing, trace_state, cycle], [playing, play_timer, play, cycle],
                   api_visibility="private")
        play_timer.tick(handlers.tick, [trace_state, cycle],
                        [cycle, output, cycle_info, tree_plot, paths, playing, play_timer, play],
                        show_progress="hidden", api_visibility="private")
        pick.input(handlers.pick_example, [pick], explore_outputs, api_visibility="private")
        upload.upload(handlers.upload, [upload], explore_outputs, api_name="replay")

        race_btn.click(handlers.queue, None, [race_message], **queued).then(
            handlers.race, [race_prompt, race_temperature, race_max_new, race_top_k, race_total, race_fta],
            race_outputs, api_name="race", show_progress="minimal", **engine_event)
        race_stop.click(handlers.stop, outputs=[race_message], concurrency_limit=None, api_visibility="private")
        race_pick.input(handlers.pick_race, [race_pick], race_outputs, api_visibility="private")
        race_upload.upload(handlers.race_upload, [race_upload], race_outputs, api_visibility="private")

    return demo


def _benchmarks() -> None:
    """The benchmark harness's results, read afresh on every page load and on *Reload results*."""
    runs = read_runs()
    if not runs:
        gr.Markdown("No benchmark results in `assets/bench/` yet. Produce them with\n\n"
                    f"```bash\n{QUICK_COMMAND}\n```\n\n(the harness writes its JSON, CSV and Markdown results there), "
                    "then press *Reload results*.")
    for number, run in enumerate(runs):
        gr.Markdown(f"## Run `{run.name}`")
        if run.summary is not None:
            for temperature in sorted(run.summary["temperature"].unique()):
                rows = task_rows(run.summary, temperature)
                with gr.Row():
                    gr.Plot(figures.grouped_bar_figure(rows, "dataset", "speedup",
                                                       f"Speed-up over AR, T = {temperature:g}"), show_label=False)
                    gr.Plot(figures.grouped_bar_figure(rows, "dataset", "tau",
                                                       f"τ (tokens per target forward), T = {temperature:g}"),
                            show_label=False)
                rates = acceptance_rows(run.summary, temperature)
                if rates:
                    gr.Plot(figures.acceptance_figure(rates), show_label=False)
        if run.report:
            with gr.Accordion("Full report", open=number == 0):
                gr.Markdown(run.report)
        for title, table in run.tables:
            if title:
                gr.Markdown(f"**{title}**")
            gr.Dataframe(table, interactive=False, wrap=True)
        if run.notes:
            gr.Markdown("\n".join(f"- {note}" for note in run.notes))


def _lesson(handlers: Handlers, examples: list[Example]) -> None:
    """The lesson text with figures drawn from the recorded example runs and the τ calculator."""
    with_fta = next((e for e in examples if any(t.settings.fta_applied for t in e.traces)), None)
    showcase = with_fta or (examples[0] if examples else None)
    for text, figure in lesson_parts():
        gr.Markdown(text, latex_delimiters=LATEX)
        if figure == "calculator":
            chain = gr.Textbox(value="0.85, 0.8, 0.75", label="Acceptance probabilities p_1, p_2, … (0 to 1)")
            gr.Examples([["0.8, 0.8, 0.8"], ["0.85, 0.8, 0.75"], ["0.9, 0.1, 1, 1, 1, 1"], ["1.0, 0.0, 1, 1, 1, 1"],
                         ["0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1"]], inputs=[chain], label="Try")
            summary, fig = handlers.tau_calculator(chain.value)
            result = gr.Markdown(summary)
            plot = gr.Plot(fig, show_label=False)
            chain.change(handlers.tau_calculator, [chain], [result, plot], api_visibility="private",
                         trigger_mode="always_last", show_progress="hidden")
        elif showcase is None:
            gr.Markdown("*(The example traces in assets/traces/ are missing: run `python -m app.record_examples`.)*")
        elif figure in ("gumiho-tree", "eagle-tree"):
            method = "gumiho" if figure == "gumiho-tree" else "eagle2"
            trace = next((t for t in showcase.traces if t.method == method), None)
            cycle = showcase_cycle(trace) if trace else None
            if cycle is not None:
                gr.Plot(figures.tree_figure(cycle, f"{method_name(method)}, cycle {cycle.index} of the example "
                                                   f"“{showcase.prompt}”"), show_label=False)
        elif figure == "timing":
            gr.Plot(figures.race_timing_figure(list(showcase.traces)), show_label=False)


def launch(demo: gr.Blocks, host: str | None = None, port: int | None = None, share: bool = False,
           block: bool = True, queue_size: int = 32) -> None:
    """Serve the page. Engine runs share one worker (concurrency_id "engine"), so visitors queue instead of
    overloading the CPU; at most `queue_size` requests wait."""
    demo.queue(max_size=queue_size, default_concurrency_limit=4).launch(
        server_name=host, server_port=port, share=share, prevent_thread_lock=not block, css=CSS,
        max_file_size="20mb", footer_links=["api", "gradio"],
    )
