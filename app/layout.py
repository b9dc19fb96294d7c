"""The page: the Blocks layout and the wiring of its events to `handlers`."""

from __future__ import annotations

import gradio as gr

from gumiho.trace import DRAFTED_METHODS
from gumiho.tree import TreeSettings

from . import figures, present
from .bench import QUICK_COMMAND, acceptance_rows, read_runs, task_rows
from .blocks import Blocks
from .examples import PROMPTS, Example, load_examples
from .handlers import PLAY, ExploreParts, Handlers, RaceParts, tau_calculator
from .lesson import lesson_cycle, lesson_parts, walkthrough
from .link_events import LinkEvents, LinkParts, link_box, link_note
from .page_download import page_file, wire_page_download
from .present import PresenterEvents, PresenterParts
from .service import RACE_DEFAULT, EngineLoader, Sessions
from .style import CSS, method_name
from .validate import FIELDS, Limits
from .views import ExploreView, RaceView, showcase_index

PLAY_EVERY_S = 0.9
LATEX = [{"left": "$$", "right": "$$", "display": True}, {"left": "$", "right": "$", "display": False}]
# The picker: the papers' methods, newest first; AR last.
METHOD_CHOICES = [(method_name(m), m) for m in reversed(DRAFTED_METHODS)] + [("AR (no drafting)", "ar")]
RACE_CHOICES = [(method_name(m), m) for m in DRAFTED_METHODS]
TREE_LABELS = {
    "top_k": "top-k (candidates per expanded node; MJSD: beams; lookup: earlier matches followed)",
    "depth": "depth (EAGLE-2: expansions; Gumiho: draft depth − 1; static trees: deepest path; MJSD: chain length; "
             "lookup, recycle: draft depth)",
    "total_tokens": "total tokens verified per cycle (root incl.)",
    "mlptopk": "Gumiho: mlptopk (candidates per MLP head)",
    "pruning": "Gumiho: pruning (nodes kept per MLP depth)",
}


def _slider(name: str, value: float, label: str, limits: Limits, step: float = 1, **kwargs) -> gr.Slider:
    allowed = limits.range(name)
    return gr.Slider(allowed.low, allowed.high, value=value, step=step, label=label, **kwargs)


def _tree_inputs(limits: Limits) -> dict[str, gr.components.Component]:
    defaults = TreeSettings.default("gumiho", "cpu").to_dict()  # the engine's own choice arrives once it has loaded
    boxes: dict[str, gr.components.Component] = {
        name: _slider(name, defaults[name], label, limits) for name, label in TREE_LABELS.items()}
    boxes["fta"] = gr.Checkbox(value=defaults["fta"], label="Gumiho: Full Tree Attention (approximate; greedy only)")
    boxes["tau_acc"] = _slider("tau_acc", TreeSettings.default("mjsd").tau_acc, "MJSD: τ_acc (a prefix passes when "
                               "min(1, P/Q) ≥ τ_acc)", limits, 0.05)
    return boxes


def _header(loader: EngineLoader, limits: Limits) -> tuple[gr.Markdown, gr.Timer]:
    gr.Markdown("# Gumiho: speculative decoding you can watch\n"
                "A small drafter guesses several tokens as a tree; the target model checks the whole tree in "
                "one forward pass and keeps the longest correct guess plus one token of its own. Pick a cycle to "
                "see its tree, race the methods, or read *How it works*.")
    status = gr.Markdown(loader.status(), elem_classes="gm-status")
    gr.Markdown(f"One engine serves every visitor, one run at a time. Limits: {limits.describe()} "
                f"(a run that reaches its time budget stops and keeps what it wrote).",
                elem_classes=["gm-status", "gm-extra"])
    return status, gr.Timer(1.0)


def build_app(loader: EngineLoader, limits: Limits = Limits(), examples: list[Example] | None = None) -> gr.Blocks:
    """The whole page. It opens on the first recorded example, so it is populated before the model has loaded."""
    examples = load_examples() if examples is None else examples
    first = examples[0] if examples else None
    explore_trace = first.trace("gumiho") if first and any(t.method == "gumiho" for t in first.traces) else (
        first.traces[0] if first else None)

    with Blocks(title="Gumiho speculative decoding explorer", delete_cache=(3600, 3600)) as demo:
        status, status_timer = _header(loader, limits)
        present_toggle, note = present.toggle(), link_note()

        with gr.Tabs() as tabs:
            with gr.Tab("Explore", id="explore"):
                with gr.Row():
                    with gr.Column(scale=3):
                        prompt = gr.Textbox(label="Prompt", lines=3,
                                            value=explore_trace.prompt if explore_trace else PROMPTS[0])
                        gr.Examples([[p] for p in PROMPTS], inputs=[prompt], label="Example prompts",
                                    elem_id="gm-explore-examples")
                    with gr.Column(scale=2):
                        method = gr.Radio(METHOD_CHOICES, value="gumiho", label="Method")
                        temperature = _slider("temperature", 0, "Temperature (0 = greedy)", limits, 0.05)
                        max_new = _slider("max_new_tokens", min(64, limits.max_new_tokens), "Max new tokens", limits)
                        with gr.Accordion("Advanced: sampling and draft tree", open=False, elem_classes="gm-extra"):
                            top_p = _slider("top_p", 1, "top-p", limits, 0.05)
                            seed = gr.Number(value=0, precision=0, label=f"Seed ({FIELDS['seed'].text()})")
                            tree = _tree_inputs(limits)
                with gr.Row():
                    generate_btn = gr.Button("Generate", variant="primary")
                    stop_btn = gr.Button("Stop", variant="stop")
                    download = gr.DownloadButton("Download trace (JSON)",
                                                 value=str(first.path(explore_trace.method)) if first else None,
                                                 elem_classes="gm-extra")
                    upload = gr.UploadButton("Replay a trace (JSON)", file_types=[".json"], elem_classes="gm-extra")
                    explore_page = gr.Button("Download as a page", elem_classes="gm-extra")
                    explore_copy = gr.Button("Copy link")
                explore_link = link_box()
                explore_page_file = page_file()
                pick = gr.Dropdown([c for e in examples for c in e.choices()], label="Recorded examples",
                                   value=f"{first.name}/{explore_trace.method}" if first else None)
                view = ExploreView.of(explore_trace, showcase_index(explore_trace) if explore_trace else None)
                message = gr.Markdown(label="message", elem_classes="gm-message")
                summary = gr.Markdown(view.summary, label="summary")
                legend = gr.HTML(view.legend, label="legend")
                output = gr.HTML(view.detail.output, label="output")
                with gr.Row(equal_height=True):
                    cycle = gr.Slider(0, view.slider_max, value=view.cycle, step=1, scale=5,
                                      label="Cycle (one target forward each)")
                    play = gr.Button(PLAY, scale=1, elem_id="gm-play")
                    speed = present.speed(PLAY_EVERY_S)
                cycle_info = gr.Markdown(view.detail.caption, label="cycle")
                tree_plot = gr.Plot(view.detail.tree, label="Draft tree")
                paths = gr.Dataframe(view.detail.paths, label="Candidate paths of this cycle", interactive=False,
                                     wrap=True)
                explore = ExploreParts(message, summary, legend, output, cycle, cycle_info, tree_plot, paths,
                                       gr.State(explore_trace), pick, download, gr.State(False),
                                       gr.Timer(PLAY_EVERY_S, active=False), play, tree)

            with gr.Tab("Race", id="race"):
                gr.Markdown("One prompt through the methods you pick, then **AR**, one after the other (never at "
                            "the same time, so the timings stay honest). Every drafter gets the same verification "
                            "budget: the same total tokens (a static tree, EAGLE's or Medusa's and Hydra's, at most "
                            "its own size; a lookup or recycle tree at most what its shape drafts) and, where its "
                            "tree has one, the same top-k. The recorded races below "
                            "were timed on a shared 2-core CPU, so their timings move with whatever else ran; race "
                            "your own prompt to see this machine now.", elem_classes="gm-extra")
                with gr.Row():
                    with gr.Column(scale=3):
                        race_prompt = gr.Textbox(label="Race prompt", lines=2,
                                                 value=first.prompt if first else PROMPTS[0])
                        gr.Examples([[p] for p in PROMPTS], inputs=[race_prompt], label="Example prompts",
                                    elem_id="gm-race-examples")
                    with gr.Column(scale=2):
                        race_methods = gr.CheckboxGroup(RACE_CHOICES, value=list(RACE_DEFAULT),
                                                        label="Methods (AR always runs, last)")
                        race_temperature = _slider("temperature", 0, "Temperature", limits, 0.05)
                        race_max_new = _slider("max_new_tokens", min(64, limits.max_new_tokens), "Max new tokens",
                                               limits)
                        race_top_k = _slider("top_k", tree["top_k"].value, "top-k (both drafters)", limits)
                        race_total = _slider("total_tokens", tree["total_tokens"].value,
                                             "total tokens verified per cycle (both drafters)", limits)
                        race_fta = gr.Checkbox(value=False, label="Gumiho: Full Tree Attention")
                with gr.Row():
                    race_btn = gr.Button("Race", variant="primary")
                    race_stop = gr.Button("Stop", variant="stop")
                    race_upload = gr.UploadButton("Replay traces (JSON, one per method)", file_types=[".json"],
                                                  file_count="multiple", elem_classes="gm-extra")
                    race_page = gr.Button("Download as a page", elem_classes="gm-extra")
                    race_copy = gr.Button("Copy link")
                race_link = link_box()
                race_page_file = page_file()
                race_pick = gr.Dropdown([(e.prompt, e.name) for e in examples], label="Recorded races",
                                        value=first.name if first else None)
                recorded = list(first.traces) if first else []
                shown = RaceView.of(recorded)
                racing = RaceParts(
                    gr.Markdown(label="message", elem_classes="gm-message"),
                    gr.Markdown(shown.headline, label="headline"),
                    gr.Dataframe(shown.table, label="Headline numbers", interactive=False),
                    gr.Plot(shown.timeline, label="Tokens over time"),
                    gr.Plot(shown.tau, label="τ per cycle"),
                    gr.Plot(shown.timing, label="Time per cycle"),
                    gr.HTML(shown.texts, label="texts"),
                    gr.State(recorded), race_pick,
                    gr.File([str(first.path(t.method)) for t in recorded] if first else None,
                            label="Traces of this race (JSON)", file_count="multiple", interactive=False,
                            elem_classes="gm-extra"),
                    race_top_k, race_total)

            with gr.Tab("Benchmarks", id="bench"), gr.Column(elem_id="gm-bench"):
                with gr.Row():
                    bench_pick = gr.Dropdown(label="Run (newest first)", scale=4, **_bench_runs())
                    bench_refresh = gr.Button("Reload results", size="sm", scale=1)
                bench_refresh.click(lambda: gr.Dropdown(**_bench_runs()), None, bench_pick, api_visibility="private",
                                    show_progress="hidden")
                gr.render(inputs=[bench_pick], triggers=[demo.load, bench_pick.change])(_benchmark)

            with gr.Tab("How it works", id="lesson"):
                _lesson(examples)

        handlers = Handlers(loader, Sessions(), examples, limits, explore, racing, status, status_timer,
                            pinned=gr.State(frozenset()))
        explore_fields = {"prompt": prompt, "method": method, "temperature": temperature, "max_new_tokens": max_new,
                          "top_p": top_p, "seed": seed, **tree}
        race_fields = {"prompt": race_prompt, "methods": race_methods, "temperature": race_temperature,
                       "max_new_tokens": race_max_new, "top_k": race_top_k, "total_tokens": race_total,
                       "fta": race_fta}
        _wire(handlers, demo, method, list(explore_fields.values()), list(race_fields.values()),
              generate_btn, stop_btn, upload, race_btn, race_stop, race_upload)
        _check_ranges(handlers, explore.message, {"temperature": temperature, "max_new_tokens": max_new,
                                                  "top_p": top_p, **{n: b for n, b in tree.items() if n != "fta"}})
        _check_ranges(handlers, racing.message, {"temperature": race_temperature, "max_new_tokens": race_max_new,
                                                 "top_k": race_top_k, "total_tokens": race_total})
        presenter = PresenterParts(present_toggle, speed)
        PresenterEvents.build(handlers, presenter).wire(demo)
        links = LinkParts(tabs, note, explore_fields, race_fields, explore_copy, explore_link, race_copy, race_link)
        LinkEvents.build(handlers, links, presenter).wire(demo)
        wire_page_download(explore_page, explore_page_file, explore.trace, explore.message)
        wire_page_download(race_page, race_page_file, racing.traces, racing.message)
    return demo


def _check_ranges(handlers: Handlers, message: gr.Markdown, boxes: dict[str, gr.Slider]) -> None:
    """A message as soon as a number typed into a slider's box is out of range (the page would clamp it silently)."""
    for name, box in boxes.items():
        box.input(handlers.range_check(name, message), [box], [message], trigger_mode="always_last",
                  show_progress="hidden", api_visibility="private", preprocess=False)  # the raw, unclamped value


def _wire(handlers: Handlers, demo: gr.Blocks, method: gr.Radio, explore_inputs: list, race_inputs: list,
          generate_btn: gr.Button, stop_btn: gr.Button, upload: gr.UploadButton, race_btn: gr.Button,
          race_stop: gr.Button, race_upload: gr.UploadButton) -> None:
    """Every event of the page. Engine runs share one worker (concurrency_id "engine"); their raw values go to
    `validate` (preprocess=False), which names the field of anything it refuses."""
    explore, racing = handlers.explore, handlers.racing
    private = dict(api_visibility="private")
    status_outputs = [handlers.status_line, handlers.status_timer, *explore.tree_fields.values(), racing.top_k,
                      racing.total_tokens]
    handlers.status_timer.tick(handlers.status, [method, handlers.pinned], status_outputs, concurrency_limit=None,
                               show_progress="hidden", **private)
    engine_event = dict(concurrency_limit=1, concurrency_id="engine", preprocess=False, show_progress="minimal")
    queued = dict(concurrency_limit=None, show_progress="hidden", **private)

    generate_btn.click(handlers.queue, None, [explore.message], **queued).success(
        handlers.generate, explore_inputs, explore.shown(), api_name="generate", **engine_event)
    stop_btn.click(handlers.stop, outputs=[explore.message], concurrency_limit=None, api_name="stop")
    # `input`, not `change`: a link sets the method together with its own tree settings
    method.input(handlers.method_defaults, [method], list(explore.tree_fields.values()), **private)
    explore.cycle.input(handlers.show_cycle, [explore.trace, explore.cycle], explore.player(),
                        trigger_mode="always_last", show_progress="hidden", **private)
    explore.play.click(handlers.toggle_play, [explore.playing, explore.trace, explore.cycle], explore.player(),
                       **private)
    explore.play_timer.tick(handlers.tick, [explore.trace, explore.cycle], explore.player(),
                            show_progress="hidden", **private)
    explore.pick.input(handlers.pick_example, [explore.pick], explore.shown(), **private)
    upload.upload(handlers.upload, [upload], explore.shown(), api_name="replay")

    race_btn.click(handlers.queue, None, [racing.message], **queued).success(
        handlers.race, race_inputs, racing.shown(), api_name="race", **engine_event)
    race_stop.click(handlers.stop, outputs=[racing.message], concurrency_limit=None, **private)
    racing.pick.input(handlers.pick_race, [racing.pick], racing.shown(), **private)
    race_upload.upload(handlers.race_upload, [race_upload], racing.shown(), **private)



def _bench_runs() -> dict:
    """The run picker's choices, the runs in assets/bench/ (read when the page is built and on *Reload results*), and
    its value, the newest."""
    names = [run.name for run in read_runs()]
    return {"choices": names, "value": names[0] if names else None}


def _benchmark(name: str | None) -> None:
    """One run of the benchmark harness, the picked one: its figures, report and tables. One at a time: the folder
    holds dozens of runs, and drawing every one on each page load took 25-30 s in a browser."""
    run = next((run for run in read_runs() if run.name == name), None) if name else None
    if run is None:
        gr.Markdown("No benchmark results in `assets/bench/` yet. Produce them with\n\n"
                    f"```bash\n{QUICK_COMMAND}\n```\n\n(the harness writes its JSON, CSV and Markdown results there), "
                    "then press *Reload results*.")
        return
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
        with gr.Accordion("Full report", open=True):
            gr.Markdown(run.report, elem_classes="gm-report")
    for title, table in run.tables:
        if title:
            gr.Markdown(f"**{title}**")
        gr.Dataframe(table, interactive=False, elem_classes="gm-table")
    if run.notes:
        gr.Markdown("\n".join(f"- {note}" for note in run.notes))


def _lesson(examples: list[Example]) -> None:
    """The lesson text with figures drawn from the recorded example runs and the τ calculator."""
    with_fta = next((e for e in examples if any(t.settings.fta_applied for t in e.traces)), None)
    showcase = with_fta or (examples[0] if examples else None)
    for text, figure in lesson_parts():
        gr.Markdown(text, latex_delimiters=LATEX)
        if figure == "calculator":
            chain = gr.Textbox(value="0.85, 0.8, 0.75", label="Acceptance probabilities p_1, p_2, … (0 to 1)")
            gr.Examples([["0.8, 0.8, 0.8"], ["0.85, 0.8, 0.75"], ["0.9, 0.1, 1, 1, 1, 1"], ["1.0, 0.0, 1, 1, 1, 1"],
                         ["0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1"]], inputs=[chain], label="Try")
            summary, fig = tau_calculator(chain.value)
            result = gr.Markdown(summary)
            plot = gr.Plot(fig, show_label=False)
            chain.change(tau_calculator, [chain], [result, plot], api_visibility="private",
                         trigger_mode="always_last", show_progress="hidden")
        elif showcase is None:
            gr.Markdown("*(The example traces in assets/traces/ are missing: run `python -m app.record_examples`.)*")
        elif figure.startswith("tree-"):
            method = figure.removeprefix("tree-")
            picked = lesson_cycle(method, showcase, examples)
            if picked is None:
                gr.Markdown(f"*(No recorded {method_name(method)} example yet: run `python -m app.record_examples` "
                            f"with its drafter loaded.)*")
            else:
                example, cycle = picked
                gr.Plot(figures.tree_figure(cycle, f"{method_name(method)}, cycle {cycle.index} of the example "
                                                   f"“{example.prompt}”"), show_label=False)
        elif figure == "walkthrough" and (picked := lesson_cycle("gumiho", showcase, examples)):
            gr.Markdown(walkthrough(*picked))
        elif figure == "timing":
            gr.Plot(figures.race_timing_figure(list(examples[0].traces)), show_label=False)  # automatic trees


def launch(demo: gr.Blocks, host: str | None = None, port: int | None = None, share: bool = False,
           block: bool = True, queue_size: int = 32) -> None:
    """Serve the page. Engine runs share one worker, so visitors queue instead of overloading the CPU; at most
    `queue_size` requests wait."""
    demo.queue(max_size=queue_size, default_concurrency_limit=4).launch(
        server_name=host, server_port=port, share=share, prevent_thread_lock=not block, css=CSS,
        max_file_size="20mb", footer_links=["api", "gradio"],
    )
