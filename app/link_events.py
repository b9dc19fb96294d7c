"""Links on the page: opening one restores its state, and reruns a live run; *Copy link* makes one.

A recorded example or race opens from its link without the engine. A live run's link (a prompt and settings)
fills the inputs and, once the engine is ready, reruns through `Handlers.generate` / `Handlers.race` with the
same seed. What a link asks for that cannot apply is said in one line under the title (`LinkState.parse` for
what is malformed; here what does not exist on this server: an example, a loaded method, a cycle of the run).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

import gradio as gr

from gumiho.trace import GenerationTrace

from .handlers import Handlers
from .links import LinkState
from .present import REDUCED_MOTION_S, PresenterParts
from .render import md
from .service import TREE_FIELDS_USED
from .style import method_name
from .validate import excerpt
from .views import ExploreView

Component = gr.components.Component
# The base of a link: a Space's own page (its app runs in an iframe on another host), else the page's address.
SPACE_PAGE = "https://huggingface.co/spaces/{}"
# Runs in the browser: a link without a base gets the page's own; the link goes to the clipboard where allowed.
COPY_JS = """async (link) => {
    const url = link.startsWith("?") ? window.location.origin + window.location.pathname + link : link;
    try { await navigator.clipboard.writeText(url); } catch (error) { /* the box below shows it */ }
    return url;
}"""
MOTION_JS = "(reduced, method) => [window.matchMedia('(prefers-reduced-motion: reduce)').matches, method]"
RERUN_JS = "(due) => { if (due) document.getElementById('gm-rerun').click(); }"
SAMPLING = ("temperature", "top_p", "seed", "max_new_tokens")


def link_note() -> gr.Markdown:
    """The line that says what a link opened and what it left out."""
    return gr.Markdown(elem_classes="gm-link-note")


def link_box() -> gr.Textbox:
    """Where *Copy link* shows the link (for a browser that keeps the clipboard to itself)."""
    return gr.Textbox(label="Link to this view (also copied to the clipboard where the browser allows it)",
                      visible=False, interactive=False, buttons=["copy"])


def space_base() -> str:
    """The Space's page where this app runs on one (env SPACE_ID, "owner/name"), else "" (the page's own address,
    known only in the browser)."""
    space = os.environ.get("SPACE_ID", "")
    return SPACE_PAGE.format(space) if space else ""


@dataclass
class LinkParts:
    """The components links read and write beyond the tabs' own parts (built by `layout`)."""

    tabs: gr.Tabs
    note: gr.Markdown
    explore_fields: dict[str, Component]  # prompt, method, then the settings, in `Handlers.generate`'s order
    race_fields: dict[str, Component]  # prompt, methods, then the settings, in `Handlers.race`'s order
    explore_copy: gr.Button
    explore_link: gr.Textbox
    race_copy: gr.Button
    race_link: gr.Textbox


@dataclass
class Rerun:
    """A live run's link waiting for its rerun: the link, and the line that says so."""

    link: LinkState
    note: str


@dataclass
class LinkEvents:
    handlers: Handlers
    parts: LinkParts
    presenter: PresenterParts
    rerun_state: gr.State  # the Rerun a live link waits on
    rerun_flag: gr.Checkbox  # hidden: read by the browser after a restore, to press `rerun_button`
    rerun_button: gr.Button  # hidden
    motion: gr.Checkbox  # hidden: the browser's prefers-reduced-motion, sent with the restore

    @classmethod
    def build(cls, handlers: Handlers, parts: LinkParts, presenter: PresenterParts) -> LinkEvents:
        """Inside the page's Blocks: adds the hidden parts of a rerun."""
        return cls(handlers, parts, presenter, gr.State(None), gr.Checkbox(False, visible="hidden"),
                   gr.Button(visible="hidden", elem_id="gm-rerun"), gr.Checkbox(False, visible="hidden"))

    # Opening a link --------------------------------------------------------------------------------------------

    def restore(self, reduced_motion: bool, method: str, request: gr.Request) -> dict:
        """The state the page's link asks for (`method`: Explore's, as the page opened). A live run's link also
        gets a `Rerun`, and the flag that makes the page press the hidden rerun button."""
        link, problems = LinkState.parse(request.query_params, self.handlers.limits)
        self.handlers.presenters.set(request, link.present)
        values: dict[Component, Any] = {self.presenter.toggle: link.present}
        if reduced_motion:
            values[self.presenter.speed] = REDUCED_MOTION_S
        if link == LinkState() and not problems:
            return values
        link = self._loaded(link, problems)
        self._settings(link, method, values)
        values[self.parts.tabs] = gr.Tabs(selected=link.tab)
        opened = self._example(link, problems, values, request) if link.example else self._live(link)
        values[self.parts.note] = opened + (f" ⚠ Left out: {md('; '.join(problems))}." if problems else "")
        if self.due(link):
            values |= {self.rerun_state: Rerun(link, values[self.parts.note]), self.rerun_flag: True}
        return values

    def due(self, link: LinkState) -> bool:
        """Whether a link asks for a live run the engine can rerun now."""
        loader = self.handlers.loader
        return (not link.example and bool(link.prompt) and link.tab in ("explore", "race") and loader.ready
                and not loader.error)

    def _loaded(self, link: LinkState, problems: list[str]) -> LinkState:
        """The link without the methods this server has not loaded (known once the engine is)."""
        engine = self.handlers.loader.engine
        if engine is None:
            return link
        loaded = {"ar", *engine.drafters}
        missing = [m for m in ([link.method] if link.method else []) + list(link.methods or ()) if m not in loaded]
        problems += [f"{method_name(m)} is not loaded on this server" for m in dict.fromkeys(missing)]
        methods = tuple(m for m in link.methods or () if m in loaded) or None
        return replace(link, method=None if link.method in missing else link.method, methods=methods)

    def _settings(self, link: LinkState, method: str, values: dict) -> None:
        """The link's prompt, method(s) and settings into the inputs of its tab (Race's, or else Explore's), over
        the defaults of the method (the engine's, once it is ready); `pinned` keeps them when the defaults arrive
        later."""
        race = link.tab == "race"
        fields = self.parts.race_fields if race else self.parts.explore_fields
        pinned = frozenset(f"race.{name}" if race else name for name in link.pinned() if name in fields)
        method = link.method or method
        if self.handlers.loader.ready:
            values |= self.handlers.status(method, pinned)
        elif link.method:
            values |= self.handlers.method_defaults(method)
        given = {"prompt": link.prompt, "method": link.method, "fta": link.fta,
                 "methods": list(link.methods) if link.methods else None, **link.settings}
        for name, box in fields.items():
            if given.get(name) is not None:  # over a default's update, which may also set `interactive`
                previous = values.get(box)
                values[box] = {**(previous if isinstance(previous, dict) else {}), **gr.update(value=given[name])}
        values[self.handlers.pinned] = pinned

    def _example(self, link: LinkState, problems: list[str], values: dict, request: gr.Request) -> str:
        """A recorded run (Explore) or race (Race) into `values`; what it opened, as Markdown."""
        example = next((e for e in self.handlers.examples if e.name == link.example), None)
        if example is None:
            problems.append(f"there is no recorded example {excerpt(link.example)}")
            return "Opened a link."
        prompt = f"“{md(example.prompt)}”"
        if link.tab == "race":
            values |= self.handlers.pick_race(example.name, request) | {self.handlers.racing.pick: example.name}
            values[self.parts.race_fields["prompt"]] = link.prompt or example.prompt
            return f"Opened the recorded race of {prompt}."
        methods = [t.method for t in example.traces]
        method = link.method if link.method in methods else "gumiho" if "gumiho" in methods else methods[0]
        if link.method and link.method != method:
            problems.append(f"the example has no recorded {method_name(link.method)} run")
        key = f"{example.name}/{method}"
        values |= self.handlers.pick_example(key, request) | {self.handlers.explore.pick: key}
        values |= {self.parts.explore_fields["prompt"]: link.prompt or example.prompt,
                   self.parts.explore_fields["method"]: method}
        opened = f"Opened the recorded {md(method_name(method))} run of {prompt}"
        if link.cycle is None:
            return f"{opened}."
        shown, cycle = self._cycle(example.trace(method), link.cycle, problems, request)
        values |= shown
        return f"{opened}, cycle {cycle}."

    def _cycle(self, trace: GenerationTrace, cycle: int, problems: list[str], request: gr.Request) -> tuple[dict, int]:
        """`trace` at `cycle` (at its last cycle where the link asks for one beyond the run), and the cycle."""
        last = max(len(trace.steps) - 1, 0)
        if cycle > last:
            problems.append(f"cycle {cycle} is beyond this run (cycles 0 to {last}): it shows cycle {last}")
        view = ExploreView.of(trace, min(cycle, last), self.handlers.presenters.style(request))
        return self.handlers.explore.values(view, trace), view.cycle

    def _live(self, link: LinkState) -> str:
        """What a link without an example opened."""
        button = "Race" if link.tab == "race" else "Generate"
        if not link.prompt or link.tab not in ("explore", "race"):
            return "Opened a link: its settings are in the inputs."
        if not self.due(link):
            return f"Opened a link: its prompt and settings are in the inputs. Press **{button}** to run them."
        seed = link.settings.get("seed", 0)
        what = ("races it again" if link.tab == "race" else
                f"runs it again with {md(method_name(link.method or 'gumiho'))}")
        return f"Opened a link to a live run: the page {what}, with the link's settings and seed {seed}."

    # Rerunning a live link -------------------------------------------------------------------------------------

    def reserve(self, rerun: Rerun | None, request: gr.Request) -> dict:
        """First step of a rerun, as of Generate and Race: Stop can cancel it while it waits for the engine."""
        if rerun is None:
            raise gr.Error("This page has no link to rerun.", print_exception=False)
        return {self._message(rerun): self.handlers.queue(request)}

    def rerun(self, rerun: Rerun, request: gr.Request, *values: Any) -> Iterator[dict]:
        """The link's run through `Handlers.generate` or `Handlers.race` (values: Explore's inputs, then Race's);
        then the cycle the link names. (`request` comes before `values`: Gradio passes it by position.)"""
        explore, race = values[:len(self.parts.explore_fields)], values[len(self.parts.explore_fields):]
        if rerun.link.tab == "race":
            yield from self.handlers.race(*race, request=request)
            return
        trace = None
        for update in self.handlers.generate(*explore, request=request):
            trace = update.get(self.handlers.explore.trace, trace)
            yield update
        if rerun.link.cycle is not None and trace is not None:
            problems: list[str] = []
            shown, _ = self._cycle(trace, rerun.link.cycle, problems, request)
            yield shown | ({self.parts.note: f"{rerun.note} ⚠ {md(problems[0])}."} if problems else {})

    def _message(self, rerun: Rerun | None) -> gr.Markdown:
        return self.handlers.racing.message if rerun and rerun.link.tab == "race" else self.handlers.explore.message

    # Copy link -------------------------------------------------------------------------------------------------

    def explore_link(self, pick: str | None, cycle: float, present: bool, *values: Any) -> dict:
        """The link of what Explore shows: a recorded run by name, else the prompt and settings to rerun."""
        fields = dict(zip(self.parts.explore_fields, values))
        query: dict[str, Any] = {"tab": "explore", "cycle": cycle}
        if pick:
            query["example"], _, query["method"] = pick.partition("/")
        else:
            used = [n for n in TREE_FIELDS_USED.get(fields["method"], ()) if n in fields]
            query |= {name: fields[name] for name in ("prompt", "method", *SAMPLING, *used)}
        return self._link(query, present, self.parts.explore_link, self.handlers.explore.message)

    def race_link(self, pick: str | None, present: bool, *values: Any) -> dict:
        """The link of what Race shows: a recorded race by name, else the prompt, methods and settings."""
        fields = dict(zip(self.parts.race_fields, values))
        query: dict[str, Any] = {"tab": "race"}
        if pick:
            query["example"] = pick
        else:
            query |= fields | {"methods": ",".join(fields["methods"] or [])}
        return self._link(query, present, self.parts.race_link, self.handlers.racing.message)

    def _link(self, query: dict[str, Any], present: bool, box: gr.Textbox, message: gr.Markdown) -> dict:
        """The link, read back through `LinkState.parse` so that it holds only what a link carries."""
        query |= {"present": "1"} if present else {}
        raw = {name: str(value) for name, value in query.items() if value is not None}
        link, problems = LinkState.parse(raw, self.handlers.limits)
        left_out = f" It leaves out: {md('; '.join(problems))}." if problems else ""
        return {box: gr.Textbox(value=f"{space_base()}?{link.to_query()}", visible=True),
                message: f"The link to this view is in the box below.{left_out}"}

    # Wiring ----------------------------------------------------------------------------------------------------

    def wire(self, demo: gr.Blocks) -> None:
        handlers, parts, explore, racing = self.handlers, self.parts, self.handlers.explore, self.handlers.racing
        private = dict(api_visibility="private", show_progress="hidden")
        inputs = [*parts.explore_fields.values(), *parts.race_fields.values()]
        restored = [*inputs, parts.tabs, parts.note, handlers.pinned, handlers.status_line, handlers.status_timer,
                    self.rerun_state, self.rerun_flag, *explore.shown(), *explore.player(), *racing.shown(),
                    self.presenter.toggle, self.presenter.speed]
        demo.load(self.restore, [self.motion, parts.explore_fields["method"]], list(dict.fromkeys(restored)),
                  js=MOTION_JS, **private).then(None, [self.rerun_flag], None, js=RERUN_JS, **private)
        self.rerun_button.click(self.reserve, [self.rerun_state], [explore.message, racing.message],
                                concurrency_limit=None, **private).success(
            self.rerun, [self.rerun_state, *inputs], list(dict.fromkeys([*explore.shown(), *racing.shown(),
                                                                          parts.note])),
            concurrency_limit=1, concurrency_id="engine", preprocess=False, **private | {"show_progress": "minimal"})
        parts.explore_copy.click(
            self.explore_link, [explore.pick, explore.cycle, self.presenter.toggle, *parts.explore_fields.values()],
            [parts.explore_link, explore.message], **private).then(
            None, [parts.explore_link], [parts.explore_link], js=COPY_JS, **private)
        parts.race_copy.click(
            self.race_link, [racing.pick, self.presenter.toggle, *parts.race_fields.values()],
            [parts.race_link, racing.message], **private).then(
            None, [parts.race_link], [parts.race_link], js=COPY_JS, **private)
