"""Presenter view (large figures, no controls a class does not need) and the keys of Explore's cycle player.

Who is in presenter view is kept here, by Gradio session, rather than in a gr.State input: every handler that draws
a figure (Generate, Race and Replay among them, public API endpoints) reads it from its `gr.Request`, so the API's
inputs stay as they are. The page's part is CSS (`style.CSS`, under `body.gm-present`), a body class set by the
toggle, and `keys.js`.

Where the visitor's system asks for reduced motion, Play advances every `REDUCED_MOTION_S` seconds instead of
`layout.PLAY_EVERY_S` (the speed slider still goes faster on request), and the page's CSS drops transitions and
animations; the figures have no Plotly transitions anyway.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import gradio as gr

from gumiho.trace import GenerationTrace

from .figures import LARGE, NORMAL, FigureStyle

if TYPE_CHECKING:
    from .handlers import Handlers

KEYS_JS = Path(__file__).with_name("keys.js").read_text(encoding="utf-8")
TOGGLE_JS = "(on) => { document.body.classList.toggle('gm-present', on === true); }"
REDUCED_MOTION_S = 3.0  # Play's pace (seconds per cycle) where the visitor's system asks for reduced motion
SLOWEST_S = 5.0


class Presenters:
    """The sessions in presenter view."""

    def __init__(self) -> None:
        self._sessions: set[str] = set()
        self._lock = threading.Lock()

    def set(self, request: gr.Request | None, on: bool) -> None:
        if request is None or not request.session_hash:
            return
        with self._lock:
            (self._sessions.add if on else self._sessions.discard)(request.session_hash)

    def style(self, request: gr.Request | None) -> FigureStyle:
        """LARGE for a visitor in presenter view; NORMAL otherwise (and for a handler called without a request)."""
        with self._lock:
            on = request is not None and request.session_hash in self._sessions
        return LARGE if on else NORMAL

    def leave(self, request: gr.Request) -> None:
        """The visitor closed the page."""
        self.set(request, False)


def toggle() -> gr.Checkbox:
    """Presenter view on or off (under the title, so it is there on every tab)."""
    return gr.Checkbox(False, label="Presenter view: large figures; ← / → step through the cycles, Space plays",
                       elem_id="gm-present", container=False)


def speed(every_s: float) -> gr.Slider:
    """Play's pace, beside it: seconds per cycle."""
    return gr.Slider(0.3, SLOWEST_S, value=every_s, step=0.1, label="Seconds per cycle (Play)", scale=2,
                     elem_id="gm-speed")


@dataclass
class PresenterParts:
    toggle: gr.Checkbox
    speed: gr.Slider


@dataclass
class PresenterEvents:
    handlers: Handlers
    parts: PresenterParts
    previous: gr.Button  # hidden: pressed by ←
    next: gr.Button  # hidden: pressed by →

    @classmethod
    def build(cls, handlers: Handlers, parts: PresenterParts) -> PresenterEvents:
        """Inside the page's Blocks: adds the hidden buttons the keys press."""
        return cls(handlers, parts, gr.Button("previous cycle", visible="hidden", elem_id="gm-previous"),
                   gr.Button("next cycle", visible="hidden", elem_id="gm-next"))

    def redraw(self, on: bool, trace: GenerationTrace | None, cycle: float, traces: list[GenerationTrace] | None,
               request: gr.Request) -> dict:
        """Presenter view on or off: the shown cycle and race drawn again in its style."""
        self.handlers.presenters.set(request, on)
        values = self.handlers.show_cycle(trace, cycle, request)
        if traces:
            values |= self.handlers.racing.values(traces, self.handlers.presenters.style(request))
        return values

    def step(self, delta: int) -> Callable[..., dict]:
        """A handler that shows the cycle `delta` away (within the run) and pauses Play."""
        ui = self.handlers.explore

        def show(trace: GenerationTrace | None, cycle: float, request: gr.Request) -> dict:
            if trace is None or not trace.steps:
                return {ui.cycle_info: gr.skip()}
            k = min(max(int(cycle) + delta, 0), len(trace.steps) - 1)
            return {ui.cycle: k, **self.handlers.show_cycle(trace, k, request), **ui.playback(False)}
        return show

    def pace(self, seconds: float) -> gr.Timer:
        return gr.Timer(value=seconds)

    def wire(self, demo: gr.Blocks) -> None:
        explore, racing = self.handlers.explore, self.handlers.racing
        private = dict(api_visibility="private", show_progress="hidden")
        demo.load(None, js=KEYS_JS, **private)
        demo.unload(self.handlers.presenters.leave)
        self.parts.toggle.change(None, [self.parts.toggle], None, js=TOGGLE_JS, **private)
        self.parts.toggle.input(self.redraw, [self.parts.toggle, explore.trace, explore.cycle, racing.traces],
                                list(dict.fromkeys([*explore.player(), *racing.shown()])), **private)
        for button, delta in ((self.previous, -1), (self.next, 1)):
            button.click(self.step(delta), [explore.trace, explore.cycle], explore.player(),
                         trigger_mode="always_last", **private)
        self.parts.speed.change(self.pace, [self.parts.speed], [explore.play_timer], **private)
