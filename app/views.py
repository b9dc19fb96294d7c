"""What each tab shows for a trace: plain values (Markdown, HTML, figures, tables), no components."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
import plotly.graph_objects as go

from gumiho.trace import CycleTrace, GenerationTrace

from . import figures, render
from .figures import NORMAL, FigureStyle


@dataclass
class CycleView:
    """One cycle of a trace: the output with that cycle outlined, a caption, the tree and the candidate paths."""

    output: str
    caption: str
    tree: go.Figure
    paths: pd.DataFrame

    @classmethod
    def of(cls, trace: GenerationTrace | None, k: int, style: FigureStyle = NORMAL) -> CycleView:
        if trace is None:
            return cls(render.EMPTY_OUTPUT, "", figures.empty_figure("no trace yet", style=style),
                       render.empty_paths_table())
        if not trace.steps:
            note = "This trace has no recorded cycles (it was recorded without the tree; use `--trace`)."
            return cls(render.output_html(trace), note, figures.empty_figure("no cycles recorded", style=style),
                       render.empty_paths_table())
        k = min(max(int(k), 0), len(trace.steps) - 1)
        step = trace.steps[k]
        return cls(render.output_html(trace, selected=k), render.cycle_markdown(step),
                   figures.tree_figure(step, style=style), render.paths_table(step))


@dataclass
class ExploreView:
    """Everything the Explore tab shows for a trace."""

    summary: str
    legend: str
    cycles: int
    cycle: int
    detail: CycleView

    @classmethod
    def of(cls, trace: GenerationTrace | None, cycle: int | None = None, style: FigureStyle = NORMAL) -> ExploreView:
        """`cycle` None shows the last cycle."""
        if trace is None:
            return cls("Generate something, or replay a trace.", "", 0, 0, CycleView.of(None, 0, style))
        n = len(trace.steps)
        k = n - 1 if cycle is None else int(cycle)
        k = min(max(k, 0), max(n - 1, 0))
        return cls(render.trace_summary(trace), render.legend_html(trace), n, k, CycleView.of(trace, k, style))

    @property
    def slider_max(self) -> int:
        return max(self.cycles - 1, 1)


@dataclass
class ProgressView:
    """What a running Explore run shows between two figure updates: the text so far and the newest cycle's caption
    (figures are rebuilt at most every few cycles: they cost the engine's process time and the page's bandwidth)."""

    summary: str
    output: str
    caption: str
    cycles: int

    @classmethod
    def of(cls, trace: GenerationTrace) -> ProgressView:
        n = len(trace.steps)
        caption = render.cycle_markdown(trace.steps[-1]) if n else ""
        return cls(render.trace_summary(trace), render.output_html(trace, selected=n - 1 if n else None), caption, n)


@dataclass
class RaceView:
    """Everything the Race tab shows for a race's traces."""

    headline: str
    table: pd.DataFrame
    timeline: go.Figure
    tau: go.Figure
    timing: go.Figure
    texts: str

    @classmethod
    def of(cls, traces: list[GenerationTrace], style: FigureStyle = NORMAL) -> RaceView:
        engine = [t for t in traces if not render.is_reference(t)]  # the reference run is a table row only
        return cls(render.race_headline(traces), render.race_table(traces),
                   figures.race_timeline_figure(engine, style), figures.race_tau_figure(engine, style),
                   figures.race_timing_figure(engine, style), render.race_texts_html(engine))


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
