"""Traces -> HTML, Markdown and tables for the page (pure functions)."""

from __future__ import annotations

import html
import re
from itertools import groupby
from pathlib import Path

import pandas as pd

from gumiho.trace import CycleTrace, GenerationTrace

from . import why
from .analysis import Token, elapsed_s, first_divergence, output_tokens, time_shares, token_ids
from .palette import token_style
from .style import method_name, source_name, source_order, token_label

PATH_COLUMNS = ["path", "tokens (root → leaf; [FTA-borrowed])", "length", "accepted", "leaf score"]
RACE_COLUMNS = ["method", "tokens", "cycles", "τ", "wall s", "tokens/s", "speed-up vs AR", "decoding speed-up",
                "vs transformers", "draft %", "verify %", "other %"]


EMPTY_OUTPUT = '<div class="gm-output"><i>no output yet</i></div>'
MARKDOWN_SPECIALS = re.compile(r"([\\`*_{}\[\]()#+!|~>-])")


def md(text: object) -> str:
    """Text from a trace or a visitor, safe inside Markdown: HTML escaped, Markdown's punctuation backslashed."""
    return MARKDOWN_SPECIALS.sub(r"\\\1", html.escape(str(text), quote=False))


def md_code(text: object) -> str:
    """Like `md`, set in monospace (backticks would let a backtick in the text end the span)."""
    return f"<code>{md(text)}</code>"


def empty_paths_table() -> pd.DataFrame:
    return pd.DataFrame(columns=PATH_COLUMNS + list(why.PROBABILITY_COLUMNS))


def _token_span(token: Token, diff: bool = False) -> str:
    if token.source == "bonus":
        classes, style, what = "gm-tok gm-bonus", "", "bonus token (the target's own next token)"
    elif token.source == "prefill":
        classes, style, what = "gm-tok", "", "first token (from the prefill forward)"
    else:
        classes, style = "gm-tok", token_style(token.source)
        what = f"draft token accepted, drafted by {source_name(token.source)}"
    if token.borrowed:
        classes += " gm-borrowed"
        what += "; at an FTA-borrowed position"
    if diff:
        classes += " gm-diff"
        what += "; differs from AR from here on"
    where = "prefill" if token.cycle < 0 else f"cycle {token.cycle}"
    return (f'<span class="{classes}" style="{style}" data-source="{html.escape(token.source)}" '
            f'title="{html.escape(where + ": " + what)}">{html.escape(token.text)}</span>')


def output_html(trace: GenerationTrace, selected: int | None = None, diverges_at: int | None = None) -> str:
    """The output with each cycle's tokens marked; `selected` outlines one cycle, `diverges_at` marks a token index
    and everything after it."""
    tokens = output_tokens(trace)
    if not tokens:
        return EMPTY_OUTPUT
    parts = []
    index = 0
    for cycle, group in groupby(tokens, key=lambda t: t.cycle):
        spans = []
        for token in group:
            if not token.special:
                spans.append(_token_span(token, diverges_at is not None and index >= diverges_at))
            index += 1
        selected_class = " gm-selected" if cycle == selected else ""
        parts.append(f'<span class="gm-cycle{selected_class}" data-cycle="{cycle}">{"".join(spans)}</span>')
    return f'<div class="gm-output">{"".join(parts)}</div>'


def legend_html(trace: GenerationTrace) -> str:
    """Colour chips for the heads that appear in this trace, plus the bonus and FTA marks."""
    sources = sorted({n.source for c in trace.steps for n in c.nodes if n.source != "root"}, key=source_order)
    chips = [f'<span style="{token_style(s)}">{html.escape(source_name(s))}</span>' for s in sources]
    chips.append('<span class="gm-bonus">bonus token</span>')
    if trace.settings.fta_applied:
        chips.append('<span class="gm-borrowed">FTA-borrowed</span>')
    return f'<div class="gm-legend">{"".join(chips)}</div>'


def trace_summary(trace: GenerationTrace) -> str:
    """One Markdown line about a whole generation."""
    tree = trace.settings.tree or {}
    shape = md(", ".join(f"{k} {v}" for k, v in tree.items()
                         if k in ("top_k", "depth", "total_tokens", "max_ngram", "min_ngram") and v))
    fta = " · FTA on" if trace.settings.fta_applied else ""
    temperature = md(trace.settings.sampling.get("temperature", 0))
    seconds = elapsed_s(trace)
    rate = len(token_ids(trace)) / seconds if seconds else 0.0
    finish = f" · finished: {md(trace.finish_reason)}" if trace.finish_reason else " · running…"
    drafter = f" · drafter {md_code(Path(trace.drafter).name)}" if trace.drafter else ""
    approximate = f"\n\n⚠ **Approximate output**: {md(trace.settings.approximate)}." \
        if trace.method == "mjsd" and trace.settings.approximate else ""
    return (f"**{method_name(trace.method)}** · {len(token_ids(trace))} tokens in {trace.cycles} cycles · "
            f"τ {_tau(trace):.2f} · {rate:.1f} tokens/s · T={temperature}"
            f"{' · tree: ' + shape if shape else ''}{fta}{drafter}{finish}{approximate}")


def _tau(trace: GenerationTrace) -> float:
    produced = len(token_ids(trace))
    return (produced - 1) / trace.cycles if trace.cycles else float(produced > 0)


def cycle_markdown(cycle: CycleTrace) -> str:
    """What happened in one cycle, in one paragraph."""
    nodes = {n.id: n for n in cycle.nodes}
    accepted = [nodes[i] for i in cycle.accepted_nodes[1:] if i in nodes]
    got = ", ".join(f"{md_code(token_label(n.text, 16))} ({md(n.source)})" for n in accepted) or "none"
    fta = " The accepted path went through an FTA-borrowed position." if cycle.fta_used else ""
    plural = "s" if cycle.tree_size != 1 else ""
    bonus = token_label(cycle.bonus_text, 16)
    sized = "" if cycle.expected_accepted is None else (
        f" (sized for this cycle: {cycle.expected_accepted:.2f} draft tokens expected, {len(accepted)} accepted)")
    return (f"**Cycle {cycle.index}** · verified a tree of {cycle.tree_size} token{plural}{sized} in one target "
            f"forward · accepted draft tokens: {got} · bonus: {md_code(bonus)} · "
            f"emitted {len(cycle.emitted)} · draft {cycle.draft_ms:.0f} ms, verify {cycle.verify_ms:.0f} ms, "
            f"other {cycle.other_ms:.0f} ms.{fta}{joint_markdown(cycle)}")


def joint_markdown(cycle: CycleTrace) -> str:
    """MJSD's check of each draft prefix as a table (empty for other methods): the target's joint probability P_i,
    the beam's Q_i, min(1, P_i / Q_i) and whether it reached τ_acc. The longest passing prefix was accepted."""
    if not cycle.joint:
        return ""
    accepted = max((c.length for c in cycle.joint if c.passed), default=0)
    rows = [f"| {c.length} | {c.p:.3g} | {c.q:.3g} | {c.ratio:.3f} | "
            f"{'✓ passes' if c.passed else '✗'}{' ← accepted' if c.length == accepted else ''} |" for c in cycle.joint]
    return ("\n\nMJSD's joint check (a prefix passes when min(1, P/Q) ≥ τ_acc; the longest passing one is "
            "accepted):\n\n| prefix i | P_i (target) | Q_i (beam) | min(1, P/Q) | |\n|---|---|---|---|---|\n"
            + "\n".join(rows))


def paths_table(cycle: CycleTrace) -> pd.DataFrame:
    """The cycle's candidate paths, most accepted first, with each token's q and p along them (at T > 0 also each
    test's threshold and draw: why.path_columns)."""
    nodes = {n.id: n for n in cycle.nodes}
    rows = []
    for number, path in enumerate(cycle.paths):
        words = [
            f"[{token_label(nodes[i].text)}]" if filled else token_label(nodes[i].text)
            for i, filled in zip(path.nodes[1:], path.filled[1:])
        ]
        rows.append({
            PATH_COLUMNS[0]: number,
            PATH_COLUMNS[1]: " → ".join(words),
            PATH_COLUMNS[2]: len(path.nodes) - 1,
            PATH_COLUMNS[3]: path.accepted,
            PATH_COLUMNS[4]: round(nodes[path.nodes[-1]].score, 2),
            **why.path_columns(cycle, path.nodes),
        })
    table = pd.DataFrame(rows) if rows else empty_paths_table()
    return table.sort_values(PATH_COLUMNS[3], ascending=False, kind="stable").reset_index(drop=True)


def decoding_rate(trace: GenerationTrace) -> float:
    """Tokens per second after the prefill (its first token excluded): what the status line's expected speed-up
    is about, where the wall-clock rate also carries the prompt's prefill, the same for every method."""
    decoding = elapsed_s(trace) - trace.prefill_ms / 1e3
    return (len(token_ids(trace)) - 1) / decoding if trace.steps and decoding > 0 else 0.0


def race_table(traces: list[GenerationTrace]) -> pd.DataFrame:
    """Headline numbers per method; speed-up is tokens/s over the AR run's tokens/s, and over plain transformers
    generate's (the reference row, which has no cycles) when it ran; the decoding speed-up leaves out the prefill."""
    rates = {t.method: len(token_ids(t)) / elapsed_s(t) if elapsed_s(t) else 0.0 for t in traces}
    decoding = {t.method: decoding_rate(t) for t in traces}
    base, decoding_base = rates.get("ar", 0.0), decoding.get("ar", 0.0)
    plain = next((rates[t.method] for t in traces if is_reference(t)), 0.0)
    rows = []
    for trace in traces:
        shares = time_shares(trace)
        rate = rates[trace.method]
        rows.append([
            method_name(trace.method) + (" +FTA" if trace.settings.fta_applied else ""),
            len(token_ids(trace)), trace.cycles, round(_tau(trace), 2), round(elapsed_s(trace), 2), round(rate, 1),
            f"{rate / base:.2f}×" if base else "–",
            f"{decoding[trace.method] / decoding_base:.2f}×" if decoding_base and decoding[trace.method] else "–",
            f"{rate / plain:.2f}×" if plain else "–",
            round(100 * shares["draft"]), round(100 * shares["verify"]), round(100 * shares["other"]),
        ])
    return pd.DataFrame(rows, columns=RACE_COLUMNS)


def is_reference(trace: GenerationTrace) -> bool:
    """The race's plain transformers generate run: a row in the table, no cycles to draw."""
    return trace.method.startswith("transformers-")


def race_headline(traces: list[GenerationTrace]) -> str:
    """A one-line verdict of the race."""
    if not traces:
        return "Run a race to compare the methods on one prompt."
    parts = []
    for _, row in race_table(traces).iterrows():
        speedup = f", {row['speed-up vs AR']} AR" if row["speed-up vs AR"] != "–" else ""
        parts.append(f"**{row['method']}** {row['tokens/s']} tokens/s (τ {row['τ']}{speedup})")
    return " · ".join(parts)


ROUNDING = {"bfloat16": "bf16", "float16": "fp16", "int4": "int4"}  # paths whose tree and AR forwards round apart


def _difference_note(trace: GenerationTrace, diverges: int | None) -> str:
    # int4's products are row-consistent: with the row-consistent attention its trees round as its AR steps do
    half = trace.settings.dtype in ROUNDING and not (trace.settings.dtype == "int4"
                                                      and trace.settings.attention.startswith("row-consistent"))
    if diverges is None and trace.method == "mjsd":
        return "identical to AR here, though MJSD is approximate by design"
    if diverges is None:
        return f"equal to AR up to {ROUNDING[trace.settings.dtype]} rounding" if half else "identical to AR"
    if trace.method == "mjsd":
        why = "MJSD accepts prefixes by joint likelihood, not token by token (approximate by design)"
    elif trace.settings.sampling.get("temperature", 0) > 0:
        why = "sampling at T > 0 draws different tokens"
    elif any(c.fta_used for c in trace.steps):
        why = "FTA accepted borrowed tokens"
    elif trace.settings.fta_applied:
        why = "FTA let short paths attend to borrowed nodes, which changed a bonus token"
    elif half:
        why = (f"the {trace.settings.dtype} path rounds a tree forward and a one-token forward differently, which "
               "can flip a near-tie")
    else:
        why = "floating-point ties in the tree forward"
    return f"differs from AR from token {diverges}: {why}"


def race_texts_html(traces: list[GenerationTrace]) -> str:
    """The texts side by side; where a text leaves AR's (FTA, or sampling at T > 0) it is marked from that token."""
    reference = next((token_ids(t) for t in traces if t.method == "ar"), None)
    columns = []
    for trace in traces:
        compared = reference is not None and trace.method != "ar"
        diverges = first_divergence(token_ids(trace), reference) if compared else None
        if trace.method == "ar":
            note = "the target's own greedy or sampled text"
        elif compared:
            note = _difference_note(trace, diverges)
        else:
            note = "AR did not run in this race, so there is no text to compare with"
        if trace.finish_reason == "stopped":
            note += " (stopped)"
        columns.append(f"<div><h4>{html.escape(method_name(trace.method))}"
                       f"{' +FTA' if trace.settings.fta_applied else ''}</h4>"
                       f"<small>{html.escape(note)}</small>{output_html(trace, diverges_at=diverges)}</div>")
    return f'<div class="gm-texts">{"".join(columns)}</div>'
