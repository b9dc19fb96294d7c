"""Traces -> Plotly figures. Pure functions: no model, no UI state."""

from __future__ import annotations

import html
import math
from collections import Counter
from dataclasses import dataclass

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from gumiho.trace import CycleTrace, GenerationTrace, TraceNode

from . import palette, why
from .analysis import timeline, tokens_per_cycle
from .palette import STATES, method_color, method_line, method_pattern, source_color, tint
from .style import method_name, source_name, source_order, token_label

FONT = dict(family="system-ui, sans-serif", size=12, color=palette.INK)
RACE_MARKS = 12  # markers a race line shows at most (its symbol, beside its colour and dash)
LEGEND_WIDTH = 520  # px a legend has in a half-width panel of the page (the Benchmarks tab's two charts)
LABEL_ROOM = 0.9  # rows above the top row, so its labels stay inside the plot


@dataclass(frozen=True)
class FigureStyle:
    """Sizes of the figures' text (px), markers (px) and lines (px): NORMAL on the page, LARGE in presenter view,
    to be read from the back of a room."""

    font: int = 12  # labels, ticks, axis titles, legend
    title: int = 14
    subtitle: int = 16  # a subplot's title (Plotly's own size)
    node: int = 13  # a draft-tree node
    root: int = 16
    bonus: int = 20  # the bonus token's star
    edge: float = 1.5  # draft edges, FTA-borrowed segments
    accepted: float = 5  # the accepted path
    line: float = 3  # the bonus link, the race's lines
    thin: float = 2  # τ per cycle
    point: int = 5  # τ per cycle's markers
    row_px: int = 36  # one leaf row of a draft tree: a node with its label above it


NORMAL = FigureStyle()
LARGE = FigureStyle(font=18, title=24, subtitle=20, node=20, root=24, bonus=30, edge=3, accepted=8, line=5, thin=3,
                    point=9, row_px=58)


def _label(text: str, width: int = 10) -> str:
    """A token as Plotly text: Plotly reads a subset of HTML, so a token like "<br>" must be escaped to show."""
    return html.escape(token_label(text, width), quote=False)


def _base_layout_dict(title: str, height: int, style: FigureStyle = NORMAL) -> dict:
    return dict(
        title=dict(text=title, x=0.01, font=dict(size=style.title)),
        height=height,
        margin=dict(l=40, r=20, t=60, b=40),
        font=dict(FONT, size=style.font),
        plot_bgcolor=palette.BACKGROUND,
        legend=dict(orientation="h", yanchor="bottom", y=1.0, x=0),
    )


def _base_layout(fig: go.Figure, title: str, height: int, style: FigureStyle = NORMAL) -> go.Figure:
    return fig.update_layout(_base_layout_dict(title, height, style))


def empty_figure(message: str, height: int = 300, style: FigureStyle = NORMAL) -> go.Figure:
    """A blank plot that says why there is nothing to draw."""
    fig = go.Figure()
    fig.add_annotation(text=message, x=0.5, y=0.5, xref="paper", yref="paper", showarrow=False,
                       font=dict(size=style.title))
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    return _base_layout(fig, "", height, style)


# ---------------------------------------------------------------------------------------------- draft tree


def tree_layout(nodes: list[TraceNode]) -> dict[int, tuple[float, float]]:
    """(x, y) per node id: x = depth, leaves on consecutive rows (best-scored child first), parents centred."""
    children: dict[int, list[TraceNode]] = {n.id: [] for n in nodes}
    for node in nodes:
        if node.parent in children:
            children[node.parent].append(node)
    rows: dict[int, float] = {}
    leaves = iter(range(len(nodes)))

    def place(node: TraceNode) -> float:
        kids = sorted(children[node.id], key=lambda n: -n.score)
        if kids:
            ys = [place(kid) for kid in kids]
            rows[node.id] = (ys[0] + ys[-1]) / 2
        else:
            rows[node.id] = float(next(leaves))
        return rows[node.id]

    for root in (n for n in nodes if n.parent not in children):
        place(root)
    return {n.id: (float(n.depth), rows[n.id]) for n in nodes}


def _segments(pairs: list[tuple[int, int]], pos: dict[int, tuple[float, float]]) -> tuple[list, list]:
    xs: list = []
    ys: list = []
    for a, b in pairs:
        if a in pos and b in pos:
            xs += [pos[a][0], pos[b][0], None]
            ys += [pos[a][1], pos[b][1], None]
    return xs, ys


def fta_segments(cycle: CycleTrace) -> list[tuple[int, int]]:
    """Path segments whose lower end Full Tree Attention borrowed from another branch (drawn dashed)."""
    pairs = []
    for path in cycle.paths:
        for i in range(1, len(path.nodes)):
            if path.filled[i] and (path.nodes[i - 1], path.nodes[i]) not in pairs:
                pairs.append((path.nodes[i - 1], path.nodes[i]))
    return pairs


def _node_hover(cycle: CycleTrace, node: TraceNode, state: str) -> str:
    head = html.escape(node.source, quote=False)
    lines = [f"<b>{_label(node.text, 24)}</b>", f"head: {head}", f"depth: {node.depth}"]
    if node.parent >= 0:
        lines.append(f"score (cum. log q): {node.score:.2f}  (path q ≈ {math.exp(node.score):.3f})")
    lines += [html.escape(line, quote=False) for line in why.hover_lines(cycle, node, state)]
    lines.append(f"node {node.id}")
    return "<br>".join(lines)


def _node_marker(node: TraceNode, state: str, lowest: float) -> tuple[str, str, str, float]:
    """(symbol, fill, outline, outline width) of a node: rejected ones crossed out and open, accepted ones ringed in
    ink; the fill's opacity shades the score relative to the tree's lowest (root and best = opaque), while the
    outline keeps the head's full colour, so that every node stands out from the plot."""
    color = source_color(node.source)
    if state == why.REJECTED:
        return "circle-x-open", color, color, 2
    shade = 1.0 if lowest == 0 else round(0.3 + 0.7 * (1 - node.score / lowest), 3)  # all an eye tells apart
    ringed = state in (why.ACCEPTED, why.ROOT)
    return "circle", tint(color, shade), palette.INK if ringed else color, 3 if ringed else 1.5


def _lines(pairs: list[tuple[int, int]], pos: dict[int, tuple[float, float]], **style) -> dict:
    xs, ys = _segments(pairs, pos)
    return dict(type="scatter", x=xs, y=ys, mode="lines", hoverinfo="skip", **style)


def tree_spec(cycle: CycleTrace, title: str | None = None, style: FigureStyle = NORMAL) -> dict:
    """One cycle's draft tree as a Plotly figure's plain data ({"data": [...], "layout": {...}}): nodes coloured by
    head and shaded by score, accepted path, FTA segments, bonus. Plain data skips Plotly's checks, which cost about
    25 ms a tree: `python -m gumiho page` draws every cycle of many runs."""
    if not cycle.nodes:
        return empty_figure("this trace has no draft tree for this cycle", style=style).to_plotly_json()
    pos = tree_layout(cycle.nodes)
    chain = list(zip(cycle.accepted_nodes, cycle.accepted_nodes[1:]))
    data = [
        _lines([(n.parent, n.id) for n in cycle.nodes if n.parent >= 0], pos, name="draft edge",
               line=dict(color=STATES.edge, width=style.edge, dash="dot"), showlegend=False),
        _lines(chain, pos, name="accepted path", line=dict(color=STATES.accepted, width=style.accepted),
               visible=True if chain else "legendonly"),
    ]
    filled = fta_segments(cycle)
    if filled:
        data.append(_lines(filled, pos, name="FTA-borrowed",
                           line=dict(color=STATES.fta, width=style.edge, dash="dash")))

    states = why.node_states(cycle)
    lowest = min(n.score for n in cycle.nodes)
    for source in sorted({n.source for n in cycle.nodes}, key=source_order):
        # The legend draws a head with its first node: one not crossed out where there is one.
        group = sorted((n for n in cycle.nodes if n.source == source), key=lambda n: states[n.id] == why.REJECTED)
        symbols, fills, outlines, widths = zip(*(_node_marker(n, states[n.id], lowest) for n in group))
        data.append(dict(
            type="scatter",
            x=[pos[n.id][0] for n in group],
            y=[pos[n.id][1] for n in group],
            mode="markers+text",
            name=html.escape(source_name(source), quote=False),
            text=[("✗ " if states[n.id] == why.REJECTED else "") + _label(n.text) for n in group],
            textposition="top center",
            customdata=[n.id for n in group],
            hovertext=[_node_hover(cycle, n, states[n.id]) for n in group],
            hoverinfo="text",
            marker=dict(size=style.root if source == "root" else style.node, symbol=list(symbols), color=list(fills),
                        line=dict(color=list(outlines), width=list(widths))),
        ))
    if why.REJECTED in states.values():  # a legend entry for the cross
        data.append(dict(type="scatter", x=[None], y=[None], mode="markers", name="✗ rejected by the target",
                         marker=dict(symbol="circle-x-open", size=style.node, color=STATES.edge, line=dict(width=2))))

    last = cycle.accepted_nodes[-1] if cycle.accepted_nodes else cycle.nodes[0].id
    bx, by = pos[last][0] + 0.5, pos[last][1] + 0.5  # between the depth columns, so it never hides a node
    data.append(dict(type="scatter", x=[pos[last][0], bx], y=[pos[last][1], by], mode="lines", showlegend=False,
                     line=dict(color=STATES.bonus, width=style.line, dash="dot"), hoverinfo="skip"))
    data.append(dict(
        type="scatter", x=[bx], y=[by], mode="markers+text", name="bonus (target's token)",
        text=[_label(cycle.bonus_text)], textposition="bottom center",
        marker=dict(symbol="star", size=style.bonus, color=STATES.bonus, line=dict(width=1, color=palette.INK)),
        hovertext=[f"<b>{_label(cycle.bonus_text, 24)}</b><br>bonus token: the target's own next token"],
        hoverinfo="text",
    ))

    leaves = max(y for _, y in pos.values()) + 1
    depth = max(x for x, _ in pos.values()) + 1
    if title is None:
        title = (f"Cycle {cycle.index}: {cycle.tree_size}-node tree, {cycle.accept_length} draft token"
                 f"{'s' if cycle.accept_length != 1 else ''} accepted + bonus")
    # Rows plus the label room above and below get a row's pixels each, on top of the title, axis and margins, so a
    # small tree (one or two rows) keeps as much room per row, and its labels stay inside the plot, as a large one;
    # and the legend beside it gets a line of its font per entry, so that it needs no scroll bar.
    entries = sum(1 for trace in data if trace.get("showlegend", True))
    height = max(160 + style.row_px * (leaves + 0.4 + LABEL_ROOM), 120 + 1.8 * style.font * entries)
    layout = _base_layout_dict(html.escape(title, quote=False), int(height), style)
    layout.update(
        xaxis=dict(title=dict(text="depth (draft tokens after the root)"), tickmode="linear", dtick=1,
                   range=[-0.5, depth + 0.5], showgrid=False, zeroline=False),
        yaxis=dict(visible=False, range=[leaves + 0.4, -LABEL_ROOM]),  # reversed: the first row at the top
        legend=dict(orientation="v", yanchor="top", y=1.0, x=1.01),
        margin=dict(layout["margin"], t=40),
    )
    return {"data": data, "layout": layout}


def tree_figure(cycle: CycleTrace, title: str | None = None, style: FigureStyle = NORMAL) -> go.Figure:
    """`tree_spec` as a figure."""
    return go.Figure(tree_spec(cycle, title, style))


# ---------------------------------------------------------------------------------------------- race charts


def _series(method: str, width: float, size: int) -> dict:
    """A method's line and markers: its colour, and its own dash and symbol for readers who cannot tell colours."""
    color, line = method_color(method), method_line(method)
    return dict(line=dict(color=color, width=width, dash=line.dash), marker=dict(symbol=line.symbol, size=size,
                                                                                 color=color))


def run_name(trace: GenerationTrace) -> str:
    fta = " +FTA" if trace.settings.fta_applied else ""
    return method_name(trace.method) + fta


def race_timeline_figure(traces: list[GenerationTrace], style: FigureStyle = NORMAL) -> go.Figure:
    """Cumulative output tokens against wall time, one line per method."""
    fig = go.Figure()
    for trace in traces:
        seconds, counts = timeline(trace)
        series = _series(trace.method, style.line, style.point + 3)
        series["marker"]["maxdisplayed"] = RACE_MARKS
        fig.add_trace(go.Scatter(x=seconds, y=counts, mode="lines+markers", name=run_name(trace), line_shape="hv",
                                 **series))
    fig.update_xaxes(title="wall time (s)", rangemode="tozero", gridcolor=palette.GRID)
    fig.update_yaxes(title="tokens generated", rangemode="tozero", gridcolor=palette.GRID)
    return _base_layout(fig, "Tokens over time (prefill included)", 380, style)


def race_timing_figure(traces: list[GenerationTrace], style: FigureStyle = NORMAL) -> go.Figure:
    """Per-cycle stacked bars of draft / verify / other time, one row per method."""
    if not traces:
        return empty_figure("no runs yet", style=style)
    fig = make_subplots(rows=len(traces), cols=1, shared_xaxes=True, vertical_spacing=0.08,
                        subplot_titles=[run_name(t) for t in traces])
    for row, trace in enumerate(traces, 1):
        cycles = [c.index for c in trace.steps]
        for part in ("draft", "verify", "other"):
            fig.add_trace(go.Bar(x=cycles, y=[getattr(c, f"{part}_ms") for c in trace.steps], name=part,
                                 legendgroup=part, showlegend=row == 1, marker_color=palette.TIMES[part],
                                 marker_pattern_shape=palette.TIME_PATTERNS[part]),
                          row=row, col=1)
        fig.update_yaxes(title_text="ms", row=row, col=1, gridcolor=palette.GRID)
    fig.update_layout(barmode="stack", bargap=0.1)
    fig.update_xaxes(title_text="cycle", row=len(traces), col=1)
    fig.update_annotations(font_size=style.subtitle)
    return _base_layout(fig, "Where each cycle's time goes", 160 + 160 * len(traces), style)


def race_tau_figure(traces: list[GenerationTrace], style: FigureStyle = NORMAL) -> go.Figure:
    """Tokens per verification forward: per cycle (left) and their histogram (right)."""
    fig = make_subplots(rows=1, cols=2, column_widths=[0.62, 0.38],
                        subplot_titles=["τ per cycle (accepted + bonus)", "histogram"])
    for trace in traces:
        per_cycle = tokens_per_cycle(trace)
        fig.add_trace(go.Scatter(x=list(range(len(per_cycle))), y=per_cycle, mode="lines+markers", name=run_name(trace),
                                 legendgroup=trace.method, **_series(trace.method, style.thin, style.point)),
                      row=1, col=1)
        counts = Counter(per_cycle)
        lengths = sorted(counts)
        fig.add_trace(go.Bar(x=lengths, y=[counts[n] for n in lengths], name=run_name(trace), legendgroup=trace.method,
                             showlegend=False, marker_color=method_color(trace.method)), row=1, col=2)
    fig.update_layout(barmode="group")
    fig.update_annotations(font_size=style.subtitle)
    _base_layout(fig, "τ: tokens per target forward", 380, style)
    fig.update_layout(legend=dict(orientation="h", yanchor="top", y=-0.22, x=0), margin=dict(b=80))
    fig.update_xaxes(title_text="cycle", row=1, col=1)
    fig.update_xaxes(title_text="tokens per cycle", dtick=1, row=1, col=2)
    fig.update_yaxes(title_text="tokens", rangemode="tozero", gridcolor=palette.GRID, row=1, col=1)
    fig.update_yaxes(title_text="cycles", gridcolor=palette.GRID, row=1, col=2)
    return fig


# ---------------------------------------------------------------------------------------------- lesson


def chain_figure(terms: list[float], gradient: list[float]) -> go.Figure:
    """The τ calculator: P(first k draft tokens accepted) per k, and how much τ gains per unit of p_k."""
    ks = list(range(1, len(terms) + 1))
    fig = go.Figure()
    fig.add_trace(go.Bar(x=ks, y=terms, name="p<sub>1</sub>·…·p<sub>k</sub>  (term k of τ)",
                         marker_color=palette.LESSON["terms"]))
    fig.add_trace(go.Scatter(x=ks, y=gradient, name="∂τ/∂p<sub>k</sub>  (value of improving position k)",
                             mode="lines+markers", line=dict(color=palette.LESSON["gain"], width=3)))
    fig.update_xaxes(title="draft position k", dtick=1)
    fig.update_yaxes(rangemode="tozero", gridcolor=palette.GRID)
    return _base_layout(fig, "Each term of τ, and the payoff of improving each position", 340)


# ---------------------------------------------------------------------------------------------- benchmarks


def grouped_bar_figure(rows: list[dict], x: str, y: str, title: str) -> go.Figure:
    """Benchmark rows (each with a "method") as bars grouped by `x`, one colour per method."""
    fig = go.Figure()
    for method in dict.fromkeys(r["method"] for r in rows):
        part = [r for r in rows if r["method"] == method]
        fig.add_trace(go.Bar(x=[str(r[x]) for r in part], y=[r[y] for r in part], name=method_name(method),
                             marker_color=method_color(method), marker_pattern_shape=method_pattern(method)))
    fig.update_layout(barmode="group")
    fig.update_yaxes(title=y, gridcolor=palette.GRID, rangemode="tozero")
    # The legend sits above the bars and grows upwards as it wraps, over the title: the top margin grows by a line
    # for each line past the first, and the title keeps to the top (by default it sits mid-margin).
    extra = 20 * (legend_lines([trace.name for trace in fig.data]) - 1)
    _base_layout(fig, title, 340 + extra)
    return fig.update_layout(margin=dict(t=60 + extra),
                             title=dict(yref="container", y=1.0, yanchor="top", pad=dict(t=12)))


def legend_lines(names: list[str], width: int = LEGEND_WIDTH) -> int:
    """Lines a horizontal legend of `names` takes in `width` pixels, as Plotly lays it out: one line where every
    entry fits, else columns as wide as the widest entry. An entry is its symbol and gap (40 px) and its name
    (about 7 px a character at the 12 px font)."""
    entries = [40 + 7 * len(name) for name in names]
    if sum(entries) <= width:
        return 1
    return math.ceil(len(entries) / max(1, width // max(entries)))


def acceptance_figure(rates: dict[str, list[float]]) -> go.Figure:
    """Acceptance rate of the draft token at each depth, one line per method."""
    fig = go.Figure()
    for method, values in rates.items():
        fig.add_trace(go.Scatter(x=list(range(1, len(values) + 1)), y=values, mode="lines+markers",
                                 name=method_name(method), **_series(method, 3, 8)))
    fig.update_xaxes(title="draft depth", dtick=1)
    fig.update_yaxes(title="accepted when reached", range=[0, 1.05], gridcolor=palette.GRID)
    return _base_layout(fig, "Per-position acceptance (mean over tasks)", 340)
