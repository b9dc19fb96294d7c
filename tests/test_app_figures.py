"""The app's pure parts: trace -> figures, HTML and tables; the τ calculator; benchmark files; settings."""

from __future__ import annotations

import json
import os
import re
import threading
from dataclasses import replace
from types import SimpleNamespace

import pytest

from app import analysis, figures, palette, render
from app.bench import acceptance_rows, read_runs, task_rows
from app.examples import load_examples
from app.lesson import lesson_parts
from app.handlers import STOPPED_IN_QUEUE, ExploreParts, Handlers, RaceParts
from app.engine_thread import ENGINE_THREAD, EngineThread
from app.service import EngineLoader, RunSettings, Sessions, follow, race_order, race_settings, save_traces
from app.palette import source_color, tint
from app.style import source_name, token_label
from app.theory import Chain
from app.validate import InvalidInput, Limits
from app.validate import trace_file as read_trace
from gumiho.errors import GumihoError
from gumiho.tree import TreeSettings

from .app_traces import ar_trace, gumiho_trace


def rgb_of(color: str) -> tuple[int, ...]:
    """The red, green and blue of "#rrggbb" or "rgba(r, g, b, a)"."""
    if color.startswith("rgba("):
        return tuple(int(v) for v in color[5:-1].split(",")[:3])
    return tuple(int(color[i : i + 2], 16) for i in (1, 3, 5))


def trace_named(fig, name):
    matches = [t for t in fig.data if t.name == name]
    assert len(matches) == 1, f"expected one trace named {name!r}, got {[t.name for t in fig.data]}"
    return matches[0]


def segments(trace) -> set[tuple[tuple[float, float], tuple[float, float]]]:
    """The line segments of a Scatter drawn as x0, x1, None, ..."""
    xs, ys = list(trace.x), list(trace.y)
    return {((xs[i], ys[i]), (xs[i + 1], ys[i + 1])) for i in range(0, len(xs), 3)}


# ---------------------------------------------------------------------------------------------- tree figure


def test_tree_figure_has_every_node_once_coloured_by_its_head():
    cycle = gumiho_trace().steps[0]
    fig = figures.tree_figure(cycle)
    by_head = {source: trace_named(fig, source_name(source)) for source in ("root", "serial-1", "serial-2", "mlp-3")}
    ids = sorted(i for t in by_head.values() for i in t.customdata)
    assert ids == [0, 1, 2, 3, 4, 5]
    assert list(by_head["serial-1"].customdata) == [1, 2]
    for source, trace in by_head.items():  # fills and outlines in the head's colour (the accepted ringed in ink)
        assert all(rgb_of(fill) == rgb_of(source_color(source)) for fill in trace.marker.color)
        assert all(line in (source_color(source), palette.INK) for line in trace.marker.line.color)
    assert source_color("serial-1") != source_color("mlp-3") != source_color("eagle-2")
    assert list(by_head["serial-2"].text) == [token_label(" sat"), token_label(" ran")] == ["␣sat", "␣ran"]


def test_tree_figure_shades_nodes_by_score():
    fig = figures.tree_figure(gumiho_trace().steps[0])
    serial = trace_named(fig, source_name("serial-2"))
    sat, ran = (float(fill.rsplit(",", 1)[1][:-1]) for fill in serial.marker.color)  # the fills' opacity
    assert 1.0 >= sat > ran > 0  # scores -0.3 and -2.0: the likelier node is more opaque
    assert list(serial.marker.line.color) == [palette.INK, source_color("serial-2")]  # its outline keeps contrast


def test_tree_figure_marks_each_state_without_colour():
    fig = figures.tree_figure(gumiho_trace().steps[0])
    serial = trace_named(fig, source_name("serial-1"))  # cat accepted, dog rejected (the target picked cat)
    assert list(serial.marker.symbol) == ["circle", "circle-x-open"] and list(serial.marker.line.width)[0] == 3
    assert list(serial.text) == ["␣cat", "✗ ␣dog"]
    assert "✗ rejected: not the target's top token (it picked “␣cat”)" in serial.hovertext[1]
    assert "q (draft) 0.905 · p (target) 0.62" in serial.hovertext[0] and "✓ accepted" in serial.hovertext[0]
    ran = trace_named(fig, source_name("serial-2")).hovertext[1]  # under the rejected dog: never checked
    assert "p (target) –" in ran and "not checked" in ran
    assert trace_named(fig, "✗ rejected by the target").marker.symbol == "circle-x-open"
    assert trace_named(fig, "draft edge").line.dash == "dot" and trace_named(fig, "accepted path").line.dash is None
    assert trace_named(fig, "bonus (target's token)").marker.symbol == "star"


def test_tree_figure_highlights_the_accepted_path_and_dashes_fta_segments():
    cycle = gumiho_trace().steps[0]
    fig = figures.tree_figure(cycle)
    pos = figures.tree_layout(cycle.nodes)
    accepted = trace_named(fig, "accepted path")
    assert segments(accepted) == {(pos[a], pos[b]) for a, b in [(0, 1), (1, 3), (3, 4)]}
    fta = trace_named(fig, "FTA-borrowed")
    assert fta.line.dash == "dash"
    assert segments(fta) == {(pos[5], pos[4])}  # ' ran' -> borrowed ' on' is not a parent-child edge
    edges = trace_named(fig, "draft edge")
    assert (pos[5], pos[4]) not in segments(edges)
    assert len(segments(edges)) == 5
    # accepted nodes get a green ring
    mlp = trace_named(fig, source_name("mlp-3"))
    assert mlp.marker.line.width[0] == 3


def test_tree_figure_shows_the_bonus_token_after_the_accepted_path():
    cycle = gumiho_trace().steps[0]
    fig = figures.tree_figure(cycle)
    bonus = trace_named(fig, "bonus (target's token)")
    assert list(bonus.text) == ["␣the"]
    x_on = figures.tree_layout(cycle.nodes)[4][0]
    assert bonus.x[0] > x_on


def test_tree_figure_without_fta_or_acceptance():
    fig = figures.tree_figure(ar_trace().steps[0])
    names = [t.name for t in fig.data]
    assert "FTA-borrowed" not in names
    assert trace_named(fig, "accepted path").visible == "legendonly"
    assert list(trace_named(fig, source_name("root")).customdata) == [0]


def test_tree_layout_puts_parents_between_their_children_and_leaves_on_their_own_rows():
    nodes = gumiho_trace().steps[0].nodes
    pos = figures.tree_layout(nodes)
    assert all(pos[n.id][0] == n.depth for n in nodes)
    leaves = [4, 5]
    assert len({pos[i][1] for i in leaves}) == 2
    assert pos[0][1] == (pos[1][1] + pos[2][1]) / 2
    assert pos[1][1] < pos[2][1]  # the better-scored child comes first


def test_hover_text_names_token_score_depth_and_head():
    fig = figures.tree_figure(gumiho_trace().steps[0])
    hover = trace_named(fig, source_name("mlp-3")).hovertext[0]
    assert "␣on" in hover and "head: mlp-3" in hover and "depth: 3" in hover and "-0.50" in hover


# ---------------------------------------------------------------------------------------------- race charts


def race_traces():
    return [gumiho_trace(), ar_trace()]


def test_race_timeline_has_one_line_per_method_ending_at_the_token_count():
    fig = figures.race_timeline_figure(race_traces())
    assert [t.name for t in fig.data] == ["Gumiho +FTA", "AR"]
    gumiho, ar = fig.data
    assert list(gumiho.y) == [0, 1, 5, 6]
    assert list(ar.y) == [0, 1, 2, 3, 4, 5, 6]
    assert gumiho.x[1] == pytest.approx(0.1) and gumiho.x[-1] == pytest.approx(0.1 + 2 * 0.085)


def test_race_timing_bars_stack_draft_verify_other_per_cycle():
    fig = figures.race_timing_figure(race_traces())
    assert fig.layout.barmode == "stack"
    bars = [(t.name, len(t.y)) for t in fig.data]
    assert bars == [("draft", 2), ("verify", 2), ("other", 2), ("draft", 5), ("verify", 5), ("other", 5)]
    assert list(fig.data[1].y) == [60.0, 60.0]


def test_race_lines_differ_by_dash_and_marker_besides_colour():
    for fig in (figures.race_timeline_figure(race_traces()), figures.race_tau_figure(race_traces())):
        gumiho, ar = [t for t in fig.data if t.type == "scatter"]
        assert gumiho.line.dash != ar.line.dash and gumiho.marker.symbol != ar.marker.symbol
        assert "markers" in gumiho.mode


def test_race_tau_figure_per_cycle_and_histogram():
    fig = figures.race_tau_figure(race_traces())
    lines = [t for t in fig.data if t.type == "scatter"]
    hist = [t for t in fig.data if t.type == "bar"]
    assert list(lines[0].y) == [4, 1] and list(lines[1].y) == [1] * 5
    assert dict(zip(hist[0].x, hist[0].y)) == {1: 1, 4: 1}
    assert dict(zip(hist[1].x, hist[1].y)) == {1: 5}


# ---------------------------------------------------------------------------------------------- analysis + HTML


def test_output_tokens_carry_their_heads_and_bonus_marks():
    tokens = analysis.output_tokens(gumiho_trace())
    assert [t.text for t in tokens] == ["The", " cat", " sat", " on", " the", "."]
    assert [t.source for t in tokens] == ["prefill", "serial-1", "serial-2", "mlp-3", "bonus", "bonus"]
    assert [t.cycle for t in tokens] == [-1, 0, 0, 0, 0, 1]


def test_output_html_marks_each_head_and_the_selected_cycle():
    html = render.output_html(gumiho_trace(), selected=1)
    for source in ("serial-1", "serial-2", "mlp-3", "bonus"):
        assert f'data-source="{source}"' in html
    assert html.count("gm-selected") == 1 and 'gm-cycle gm-selected" data-cycle="1"' in html
    assert "gm-diff" not in html
    assert render.output_html(gumiho_trace(), diverges_at=4).count("gm-diff") == 2


def test_output_html_escapes_token_text():
    trace = ar_trace()
    trace.steps[0].bonus_text = "<script>"
    assert "<script>" not in render.output_html(trace) and "&lt;script&gt;" in render.output_html(trace)


def test_paths_table_lists_paths_most_accepted_first_with_borrowed_tokens_bracketed():
    table = render.paths_table(gumiho_trace().steps[0])
    assert list(table["accepted"]) == [3, 0]
    assert table.iloc[1, 1] == "␣dog → ␣ran → [␣on]"
    assert list(table["length"]) == [3, 3]
    assert table.iloc[0]["q (draft)"] == "0.905 → 0.819 → 0.819"
    assert table.iloc[0]["p (target)"] == "0.62 → 0.9 → 0.51"
    assert table.iloc[1]["p (target)"] == "0.2 → – → 0.51"  # ran's parent row was never computed
    assert "draw" not in table.columns  # greedy: the target's argmax decides, no draw


def test_a_sampled_cycle_shows_each_test_and_its_draw():
    cycle = gumiho_trace().steps[0]
    nodes = [replace(n, accept=a, draw=d) for n, (a, d) in zip(cycle.nodes, [(None, None), (0.62, 0.31),
                                                                            (None, None), (0.9, 0.05), (0.51, 0.5),
                                                                            (None, None)])]
    cycle = replace(cycle, nodes=nodes)
    table = render.paths_table(cycle)
    assert table.iloc[0]["min(1, p′/q′)"] == "0.62 → 0.9 → 0.51"
    assert table.iloc[0]["draw"] == "0.31 → 0.05 → 0.5"
    hover = trace_named(figures.tree_figure(cycle), source_name("serial-1")).hovertext
    assert "draw 0.31 &lt; min(1, p′/q′) = 0.62" in hover[0]  # escaped for Plotly
    assert "not tested: a sibling before it passed" in hover[1]  # dog came after the accepted cat


def test_race_table_speedup_is_over_ar():
    table = render.race_table(race_traces())
    assert list(table["method"]) == ["Gumiho +FTA", "AR"]
    assert list(table["speed-up vs AR"]) == ["2.00×", "1.00×"]
    assert list(table["decoding speed-up"]) == ["2.50×", "1.00×"]  # 0.2 s against 0.5 after the same 0.1 s prefill
    assert list(table["τ"]) == [2.5, 1.0]


def test_the_transformers_reference_is_a_table_row_and_nothing_else():
    from dataclasses import replace

    from app.views import RaceView

    plain = replace(ar_trace(), method="transformers-bf16", steps=[], wall_s=1.2)  # half AR's speed
    table = render.race_table(race_traces() + [plain])
    assert list(table["method"]) == ["Gumiho +FTA", "AR", "transformers generate (bf16)"]
    assert list(table["vs transformers"]) == ["4.00×", "2.00×", "1.00×"]
    assert list(render.race_table(race_traces())["vs transformers"]) == ["–", "–"]
    view = RaceView.of(race_traces() + [plain])
    assert [t.name for t in view.timeline.data] == ["Gumiho +FTA", "AR"]  # no cycles to draw for the reference
    assert "transformers generate" not in view.texts


def test_race_texts_mark_where_a_text_leaves_ar():
    same = render.race_texts_html(race_traces())
    assert "identical to AR" in same and "gm-diff" not in same
    other = ar_trace(("The", " dog", " sat", " on", " the", "."))
    differs = render.race_texts_html([gumiho_trace(), other])
    assert "differs from AR from token 1" in differs and "gm-diff" in differs


def test_int4_is_identical_to_ar_with_the_row_consistent_attention_and_equal_up_to_rounding_without():
    from dataclasses import replace

    def on_int4(trace, attention):
        return replace(trace, settings=replace(trace.settings, dtype="int4", attention=attention))

    exact = render.race_texts_html([on_int4(t, "row-consistent") for t in race_traces()])
    assert "identical to AR" in exact and "rounding" not in exact
    sdpa = render.race_texts_html([on_int4(t, "sdpa") for t in race_traces()])
    assert "equal to AR up to int4 rounding" in sdpa


def test_timeline_and_divergence_helpers():
    seconds, counts = analysis.timeline(gumiho_trace())
    assert counts == [0, 1, 5, 6] and seconds[0] == 0
    assert analysis.first_divergence([1, 2, 3], [1, 2, 4]) == 2
    assert analysis.first_divergence([1, 2], [1, 2, 3]) is None
    shares = analysis.time_shares(gumiho_trace())
    assert shares["verify"] == pytest.approx(60 / 85)


# ---------------------------------------------------------------------------------------------- τ calculator


def test_chain_tau_matches_the_blog_examples():
    assert Chain.parse("0.8, 0.8, 0.8").tau == pytest.approx(1.952)
    assert Chain.parse("0.85 0.8 0.75").tau == pytest.approx(2.040)
    assert Chain.parse("0.9, 0.1, 1, 1, 1, 1").tau == pytest.approx(1.35)
    assert Chain.parse("1.0, 0.0, 1, 1, 1, 1").tau == pytest.approx(1.0)


def test_chain_gradient_matches_finite_differences_and_favours_early_positions():
    p = [0.7, 0.6, 0.5, 0.4]
    chain = Chain(tuple(p))
    for j, grad in enumerate(chain.gradient()):
        bumped = list(p)
        bumped[j] += 1e-6
        assert grad == pytest.approx((Chain(tuple(bumped)).tau - chain.tau) / 1e-6, rel=1e-4)
    grads = Chain((0.8,) * 5).gradient()
    assert grads == sorted(grads, reverse=True)


@pytest.mark.parametrize("text", ["", "abc", "0.5, 1.5", "-0.1", ",".join(["0.5"] * 17)])
def test_chain_rejects_bad_input_with_a_message(text):
    with pytest.raises(ValueError) as err:
        Chain.parse(text)
    assert str(err.value)


# ---------------------------------------------------------------------------------------------- files


def bench_summary() -> list[dict]:
    rows = []
    for method, speedup, tau in (("ar", 1.0, 1.0), ("eagle2", 1.3, 2.5), ("gumiho", 1.5, 2.9)):
        for dataset in ("mt_bench", "gsm8k", "mean"):
            rows.append({"temperature": 0.0, "method": method, "dataset": dataset, "tau": tau, "speedup": speedup,
                         "accept_1": 0.8 if method != "ar" else None, "accept_2": 0.6 if method != "ar" else None})
    return rows


def test_bench_reader_reads_harness_runs_and_anything_else(tmp_path):
    (tmp_path / "cpu-quick.json").write_text(json.dumps({"schema": 1, "name": "cpu-quick", "summary": bench_summary()}))
    (tmp_path / "cpu-quick.md").write_text("# Benchmark `cpu-quick`\n")
    (tmp_path / "cpu-quick.summary.csv").write_text("temperature,method\n0,ar\n")  # a companion: not repeated
    (tmp_path / "handmade.csv").write_text("depth,rate\n1,0.5\n2,0.3\n")
    (tmp_path / "other.json").write_text(json.dumps({"machine": "2-core EPYC", "rows": [{"a": 1}, {"a": 2}]}))
    (tmp_path / "broken.json").write_text("{not json")
    runs = {run.name: run for run in read_runs(tmp_path)}
    assert set(runs) == {"cpu-quick", "handmade", "other", "broken"}
    quick = runs["cpu-quick"]
    assert quick.report.startswith("# Benchmark") and len(quick.summary) == 9 and not quick.tables
    assert [r["dataset"] for r in task_rows(quick.summary, 0.0)] == ["mt_bench", "gsm8k"] * 3
    assert acceptance_rows(quick.summary, 0.0) == {"eagle2": [0.8, 0.6], "gumiho": [0.8, 0.6]}
    assert list(runs["handmade"].tables[0][1].columns) == ["depth", "rate"]
    assert runs["other"].tables[0][0] == "rows" and runs["other"].notes == ["**machine**: 2-core EPYC"]
    assert "could not read `broken.json`" in runs["broken"].notes[0]


def test_bench_reader_lists_the_newest_run_first_whatever_its_size(tmp_path):
    def write(name: str, prompts: int, created: str) -> None:
        summary = [dict(row, prompts=prompts) for row in bench_summary()]
        (tmp_path / f"{name}.json").write_text(json.dumps({"name": name, "created": created, "summary": summary}))

    write("a-small-new", 4, "2026-11-23T07:00:00+00:00")
    write("b-full", 80, "2026-11-01T00:00:00+00:00")
    write("c-small-old", 4, "2026-11-20T00:00:00+00:00")
    (tmp_path / "notes.json").write_text(json.dumps({"machine": "2-core EPYC"}))
    runs = read_runs(tmp_path)
    assert [run.name for run in runs] == ["a-small-new", "c-small-old", "b-full", "notes"]
    assert runs[2].prompts == 160  # two datasets of 80 conversations


def test_bench_chart_legend_that_wraps_gets_room_above_the_bars_not_over_the_title():
    def chart(methods: list[str]):
        rows = [dict(method=m, dataset="gsm8k", speedup=1.0) for m in methods]
        return figures.grouped_bar_figure(rows, "dataset", "speedup", "speed-up")

    few = chart(["ar", "eagle2", "gumiho"])
    many = chart(["ar", "eagle2", "gumiho", "lookup", "recycle", "transformers-fp32", "transformers-bf16"])
    assert few.layout.margin.t == 60 and few.layout.height == 340  # one line of legend
    assert figures.legend_lines([t.name for t in many.data]) == 4  # columns as wide as "transformers generate (…)"
    assert many.layout.margin.t == 60 + 3 * 20 and many.layout.height == 340 + 3 * 20


def test_a_recorded_race_keeps_each_methods_run_of_median_wall_time():
    from app.record_examples import main, median_run

    runs = [SimpleNamespace(name=name, wall_s=wall) for name, wall in (("slow", 0.3), ("fast", 0.1), ("typical", 0.2))]
    assert median_run(runs).name == "typical"
    assert median_run(runs[:1]).name == "slow"
    with pytest.raises(SystemExit) as stop:
        main(["--rounds", "0"])
    assert stop.value.code == 2


def test_bench_charts_have_one_series_per_method():
    rows = [r for r in bench_summary() if r["dataset"] != "mean"]
    fig = figures.grouped_bar_figure(rows, "dataset", "speedup", "speed-up")
    assert [t.name for t in fig.data] == ["AR", "EAGLE-2", "Gumiho"]
    assert list(fig.data[2].y) == [1.5, 1.5]
    fig = figures.acceptance_figure({"gumiho": [0.8, 0.6]})
    assert list(fig.data[0].x) == [1, 2] and fig.data[0].name == "Gumiho"


def test_bench_reader_without_results(tmp_path):
    assert read_runs(tmp_path / "missing") == []


def test_read_trace_explains_bad_files(tmp_path):
    cases = {"binary.json": b"\xff\xfe\x00junk", "text.json": b"hello", "schema.json": b'{"schema": 99}',
             "list.json": b"[1, 2]", "fields.json": b'{"schema": 1, "method": "gumiho"}'}
    for name, content in cases.items():
        path = tmp_path / name
        path.write_bytes(content)
        with pytest.raises(InvalidInput) as err:
            read_trace(path)
        assert str(err.value)
    good = tmp_path / "good.json"
    good.write_text(gumiho_trace().to_json())
    assert read_trace(good).token_ids == gumiho_trace().token_ids


def test_shipped_examples_are_valid_races_of_every_method():
    examples = load_examples()
    assert examples, "assets/traces/ holds no examples: run python -m app.record_examples"
    for example in examples:
        methods = [t.method for t in example.traces]
        assert methods == race_order(methods) and {"eagle1", "eagle2", "gumiho"} <= set(methods)
        assert len({t.prompt for t in example.traces}) == 1
        assert all(t.steps and t.finish_reason in ("eos", "length") for t in example.traces)
        assert example.trace("ar").tau == 1.0
        sources = [{n.source for n in cycle.nodes} for cycle in example.trace("gumiho").steps]
        assert any({"root", "serial-1"} <= s for s in sources)  # automatic trees: one draft token at least
    showcase = next(e for e in examples if any(t.settings.fta_applied for t in e.traces))  # a fixed 12-token tree
    assert any({"serial-1", "serial-2", "mlp-3"} <= {n.source for n in cycle.nodes}
               for cycle in showcase.trace("gumiho").steps)


def test_lesson_has_its_figures_in_order():
    parts = lesson_parts()
    assert [name for _, name in parts] == ["tree-gumiho", "walkthrough", "tree-eagle2", "calculator", "timing",
                                           "tree-medusa", "tree-hydra", "tree-eagle1", "tree-mjsd", "tree-lookup",
                                           "tree-recycle"]
    assert all(text for text, _ in parts)
    assert r"\sum_{k=1}^{K} \prod_{i \le k} p_i" in parts[3][0]


def test_the_lesson_explains_one_recorded_cycle_node_by_node(tmp_path):
    from dataclasses import replace

    from app.examples import Example
    from app.lesson import lesson_cycle, walkthrough

    example = Example("fixture", tmp_path, (gumiho_trace(),))
    picked = lesson_cycle("gumiho", example, [example])
    assert picked and picked[1].index == 0  # the showcase cycle: the one that accepted most
    rows = [line for line in walkthrough(*picked).splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert len(rows) == 5
    assert "| 0.905 | 0.62 | ✓ the target" in rows[0]  # cat: q, p, passed
    assert "✗ not the target" in rows[1] and "it picked" in rows[1]  # dog
    assert "| 0.607 | – | · not checked" in rows[4]  # ran, under the rejected dog: its row was never computed
    assert lesson_cycle("medusa", example, [example]) is None
    trace = gumiho_trace()  # a lookup-switch cycle accepting more is no showcase of the drafter's own tree
    switched = replace(trace.steps[0], index=1, nodes=[replace(n, source="lookup" if n.parent >= 0 else "root")
                                                       for n in trace.steps[0].nodes])
    trace.steps = [replace(trace.steps[0], accepted_nodes=[0, 1], accepted_tokens=[11]), switched]
    assert lesson_cycle("gumiho", Example("fixture", tmp_path, (trace,)), [])[1].index == 0


# ---------------------------------------------------------------------------------------------- service


def test_run_settings_validate_into_engine_configs():
    config = RunSettings(max_new_tokens=12, total_tokens=16, fta=True).config("gumiho", TreeSettings.default("gumiho", "cpu"))
    assert config.tree.total_tokens == 16 and config.tree.fta and config.max_new_tokens == 12
    assert RunSettings(fta=True).config("eagle2", TreeSettings.default("eagle2", "cpu")).tree.fta is False  # FTA belongs to Gumiho's tree
    assert RunSettings().config("ar", None).tree is None
    assert RunSettings().config("gumiho", TreeSettings.default("gumiho", "cuda")).tree.total_tokens == 64  # base kept
    for bad, method in [(RunSettings(max_new_tokens=0), "gumiho"), (RunSettings(temperature=-1), "ar"),
                        (RunSettings(total_tokens=500), "gumiho")]:
        with pytest.raises(GumihoError):
            bad.config(method, TreeSettings.default(method, "cpu"))


def test_values_left_at_the_automatic_tree_keep_it_sized_and_first_level():
    """The page always sends every control's value: those equal to the automatic tree's leave it as it is (sized
    per cycle, first level); a changed size fixes the tree in the method's own shape."""
    automatic = replace(TreeSettings.default("gumiho", "cpu"), top_k=2, total_tokens=3, sized=True, first_level=True,
                        lookup_branches=0)
    values = {name: getattr(automatic, name) for name in ("top_k", "depth", "total_tokens", "mlptopk", "pruning")}
    assert RunSettings(**values, fta=automatic.fta).config("gumiho", automatic).tree == automatic
    fixed = RunSettings(**{**values, "total_tokens": 6}, fta=automatic.fta).config("gumiho", automatic).tree
    assert fixed.total_tokens == 6 and not fixed.sized and not fixed.first_level


def test_race_settings_match_the_verification_budget():
    configs = {m: s.config(m, TreeSettings.default(m, "cpu")) for m, s in race_settings(RunSettings(top_k=3, total_tokens=20)).items()}
    assert list(configs) == ["eagle2", "gumiho", "ar"]
    assert configs["eagle2"].tree.total_tokens == configs["gumiho"].tree.total_tokens == 20
    assert configs["eagle2"].tree.top_k == configs["gumiho"].tree.top_k == 3
    assert configs["ar"].tree is None
    # Any methods, in the papers' order; a static tree verifies at most its own size.
    wide = race_settings(RunSettings(total_tokens=40), ["gumiho", "eagle1"])
    assert list(wide) == ["eagle1", "gumiho", "ar"]
    eagle1 = wide["eagle1"].config("eagle1", TreeSettings.default("eagle1", "cpu")).tree
    assert eagle1.total_tokens == 26 and eagle1.depth == 5


def test_follow_passes_on_the_newest_item_and_always_the_last():
    assert list(follow(iter(range(5)), 0.001, lambda: None))[-1] == 4
    slow = list(follow(iter(range(1000)), 3600, lambda: None))  # the consumer is slower than the producer
    assert slow == [999]


def test_follow_raises_the_producers_error():
    def failing():
        yield 1
        raise GumihoError("the prompt is empty")
    with pytest.raises(GumihoError, match="the prompt is empty"):
        list(follow(failing(), 0.001, lambda: None))


def test_follow_stops_the_run_when_the_page_goes_away():
    stopped = threading.Event()

    def endless():
        while not stopped.is_set():
            yield 1
    items = follow(endless(), 0.001, stopped.set)
    assert next(items) == 1
    items.close()  # Gradio closes the generator when the visitor leaves
    assert stopped.is_set()


def test_the_model_loads_and_every_run_goes_on_one_long_lived_thread():
    """One thread for all torch work keeps one OpenMP team (app/engine_thread.py: a second one slows every kernel)."""
    def thread_of():
        yield threading.get_ident()

    loaded_on = []
    EngineLoader(lambda report: loaded_on.append(threading.get_ident())).start().wait(60)
    runs = [list(follow(thread_of(), 0.001, lambda: None))[-1] for _ in range(3)]
    assert len({*loaded_on, *runs}) == 1
    assert runs[0] != threading.get_ident() and runs[0] == ENGINE_THREAD.ident


def test_a_forked_process_starts_an_engine_thread_of_its_own():
    thread = EngineThread("test-engine")
    done = threading.Event()
    thread.submit(done.set)
    assert done.wait(60)
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # the child: its parent's thread is gone; a job must still run
        ran = threading.Event()
        thread.submit(ran.set)
        os.write(write, b"1" if ran.wait(30) else b"0")
        os._exit(0)
    os.waitpid(child, 0)
    assert os.read(read, 1) == b"1"


def test_sessions_stop_only_their_own_run():
    sessions = Sessions()
    with sessions.control("a") as a, sessions.control("b") as b:
        assert sessions.stop("a")
        assert a.stopped and not b.stopped
    assert not sessions.stop("a")


def test_stop_reaches_a_run_still_waiting_in_the_queue():
    sessions = Sessions()
    sessions.reserve("a")  # Generate pressed while another visitor's run holds the engine
    assert sessions.stop("a")
    with sessions.control("a") as queued:
        assert queued.stopped, "the run sees the Stop when its turn comes"
    assert not sessions.stop("a")
    sessions.reserve("a")
    with sessions.control("a") as running, sessions.control("a") as direct:  # the second: an API call, unqueued
        assert not running.stopped and sessions.stop("a") and running.stopped and direct.stopped


def handlers_for(loader=None, limits: Limits = Limits()) -> Handlers:
    """Handlers writing to fresh components (outside any page: only their identity matters)."""
    import gradio as gr

    from app.layout import TREE_LABELS

    loader = loader or SimpleNamespace(device="cpu", ready=False,
                                       default_tree=lambda method: TreeSettings.default(method, "cpu"))
    tree = {name: gr.Slider(label=name) for name in TREE_LABELS} | {"fta": gr.Checkbox()}
    explore = ExploreParts(gr.Markdown(), gr.Markdown(), gr.HTML(), gr.HTML(), gr.Slider(), gr.Markdown(), gr.Plot(),
                           gr.Dataframe(), gr.State(), gr.Dropdown(), gr.DownloadButton(), gr.State(), gr.Timer(),
                           gr.Button(), tree)
    racing = RaceParts(gr.Markdown(), gr.Markdown(), gr.Dataframe(), gr.Plot(), gr.Plot(), gr.Plot(), gr.HTML(),
                       gr.State(), gr.Dropdown(), gr.File(), gr.Slider(), gr.Slider())
    return Handlers(loader, Sessions(), [], limits, explore, racing, gr.Markdown(), gr.Timer())


def test_a_run_stopped_in_the_queue_never_starts():
    from .conftest import tiny_engine

    engine = tiny_engine()
    loader = SimpleNamespace(wait=lambda timeout: engine, engine=engine, phase="ready", device="cpu")
    handlers, request = handlers_for(loader), SimpleNamespace(session_hash="a")
    ran = []
    engine.run = lambda *a, **k: ran.append(a)  # the run must not even be created
    handlers.queue(request)
    assert handlers.stop(request).startswith("Stopping")
    outputs = list(handlers.generate("hi", "gumiho", 0.0, 8, 1.0, 0, 2, 3, 6, 2, 2, False, 0.9, request))
    assert outputs[-1][handlers.explore.message] == STOPPED_IN_QUEUE and not ran


def test_a_second_run_of_the_same_visitor_is_refused_while_one_is_queued_or_running():
    import gradio as gr

    handlers, request = handlers_for(), SimpleNamespace(session_hash="a")
    handlers.queue(request)
    with pytest.raises(gr.Error, match="A run is in progress: Stop it first"):
        handlers.queue(request)
    assert handlers.queue(SimpleNamespace(session_hash="b"))  # another visitor just waits


@pytest.mark.parametrize("run", ["generate", "race"])
@pytest.mark.parametrize("bad", ["input", "type"])
def test_a_refused_run_frees_the_visitor_for_the_next_one(run, bad):
    """Generate (or Race) with an empty prompt, or a value of the wrong type from the API, is refused; the
    visitor's next click must start a run, not be told that one is in progress."""
    import gradio as gr

    handlers, request = handlers_for(), SimpleNamespace(session_hash="a")
    prompt = "" if bad == "input" else 42
    args = (prompt, "gumiho", 0.0, 8, 1.0, 0, 2, 3, 6, 2, 2, False, 0.9) if run == "generate" else \
        (prompt, ["eagle2"], 0.0, 8, 2, 6, False)
    ui, handler = (handlers.explore, handlers.generate) if run == "generate" else (handlers.racing, handlers.race)
    handlers.queue(request)
    if bad == "input":
        assert list(handler(*args, request))[-1][ui.message].startswith("⚠")
    else:
        with pytest.raises(gr.Error):
            list(handler(*args, request))
    assert not handlers.sessions.busy("a")
    assert handlers.queue(request)


def test_the_time_budget_stops_a_run_after_its_current_cycle_and_keeps_its_tokens():
    from app.service import Control, stream
    from gumiho.engine import GenerationConfig

    from .conftest import tiny_engine

    control = Control()
    traces = list(stream(tiny_engine(), "w1 w2 w3", "gumiho", GenerationConfig(max_new_tokens=200), control,
                         Limits(max_run_seconds=0)))
    assert control.out_of_time and traces[-1].finish_reason == "stopped"
    assert traces[-1].cycles == 1 and traces[-1].new_tokens >= 2


def test_a_prompt_over_the_token_limit_is_refused_before_its_prefill():
    from app.service import Control, stream
    from gumiho.engine import GenerationConfig

    from .conftest import tiny_engine

    with pytest.raises(InvalidInput, match="the prompt is 5 tokens; this app accepts at most 4"):
        next(stream(tiny_engine(), "w1 w2 w3 w4 w5", "ar", GenerationConfig(chat=False), Control(),
                    Limits(max_prompt_tokens=4)))


def test_a_cycle_that_cannot_be_drawn_gets_a_message():
    trace = gumiho_trace()
    trace.steps[0].paths[0].nodes.clear()  # damaged after loading: the handlers must not raise
    handlers = handlers_for()
    with pytest.warns(UserWarning, match="Something went wrong"):  # also shown as a toast, without the exception
        assert handlers.show_cycle(trace, 0)[handlers.explore.cycle_info].startswith("⚠")
        assert handlers.tick(trace, -1)[handlers.explore.cycle_info].startswith("⚠")


def test_saved_traces_round_trip_and_old_files_are_pruned(tmp_path):
    old = tmp_path / "run-old"
    old.mkdir()
    os.utime(old, (0, 0))
    paths = save_traces([gumiho_trace(), ar_trace()], root=tmp_path)
    assert [read_trace(p).method for p in paths] == ["gumiho", "ar"]
    assert not old.exists()


def test_token_labels_show_whitespace():
    assert token_label(" hi") == "␣hi" and token_label("\n") == "⏎" and token_label("") == "∅"
    assert len(token_label("x" * 40)) == 10


def test_switching_method_keeps_every_tree_field_in_range():
    handlers = handlers_for()
    boxes = handlers.explore.tree_fields
    for method in ("eagle2", "ar", "gumiho"):
        updates = {name: handlers.method_defaults(method)[box] for name, box in boxes.items()}
        for name, update in updates.items():
            if name != "fta" and "value" in update:
                assert update["value"] >= 1, (method, name, update)
    eagle = {name: handlers.method_defaults("eagle2")[box] for name, box in boxes.items()}
    assert eagle["mlptopk"] == {"__type__": "update", "interactive": False}
    assert eagle["depth"]["value"] == 5 and eagle["depth"]["interactive"]


# ---------------------------------------------------------------------------------------------- input checks


def test_numbers_are_checked_against_their_field_and_range():
    from app.validate import FIELDS, WrongType, number, numbers

    assert numbers(Limits(), seed=2**63 - 1, top_p=0.5, max_new_tokens=512.0) == {
        "seed": 2**63 - 1, "top_p": 0.5, "max_new_tokens": 512}
    for value, expected in [(2**80, "seed must be between 0 and 2^63-1"), (float("nan"), "finite"),
                            (float("inf"), "finite"), (1.5, "whole number"), (-1, "between")]:
        with pytest.raises(InvalidInput, match=re.escape(expected)):
            number(FIELDS["seed"], value)
    for value in ("1", None, True, [1]):
        with pytest.raises(WrongType, match="seed must be a number"):
            number(FIELDS["seed"], value)
    with pytest.raises(InvalidInput, match="max new tokens must be between 1 and 64, got 65"):
        numbers(Limits(max_new_tokens=64), max_new_tokens=65)


def test_uploads_are_read_with_a_nesting_limit(tmp_path):
    from app.validate import json_depth

    assert json_depth('{"a": [1, {"b": "[[[["}]}') == 3  # brackets inside strings do not count
    assert json_depth(gumiho_trace().to_json()) <= 6
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(InvalidInput, match="nests more than 16 levels"):
        read_trace(deep)


def test_text_from_a_trace_is_escaped_in_markdown_and_html():
    trace = gumiho_trace()
    trace.drafter = "<img src=x onerror=alert(1)>`*x*`"
    trace.steps[0].nodes[1].source = '"><script>alert(1)</script>'
    summary = render.trace_summary(trace)
    assert "<img" not in summary and "&lt;img" in summary and "\\`" in summary
    assert "<script>" not in render.output_html(trace) and "<script>" not in render.legend_html(trace)
    assert "<script>" not in render.cycle_markdown(trace.steps[0])


def test_special_tokens_are_hidden_in_the_text_but_kept_in_the_trace():
    trace = gumiho_trace()
    trace.steps[-1].bonus_text = "<|im_end|>"
    trace.finish_reason = "eos"
    tokens = analysis.output_tokens(trace)
    assert tokens[-1].special and not any(t.special for t in tokens[:-1])
    assert "im_end" not in render.output_html(trace)
    assert trace.token_ids[-1] == trace.steps[-1].emitted[-1]


def test_a_stopped_race_without_ar_compares_with_nothing():
    eagle = gumiho_trace()
    eagle.method, eagle.finish_reason = "eagle2", "stopped"
    texts = render.race_texts_html([eagle])
    assert "the target's own" not in texts and "AR did not run" in texts and "(stopped)" in texts


def test_tree_labels_have_room_above_the_top_row():
    fig = figures.tree_figure(gumiho_trace().steps[0])
    bottom, top = fig.layout.yaxis.range
    assert top <= -0.8 and bottom > max(y for t in fig.data for y in (t.y or ()) if y is not None)


def test_the_calculator_legend_has_no_raw_latex():
    fig = figures.chain_figure([0.8, 0.64], [1.8, 1.0])
    assert all("_{" not in t.name and "p_" not in t.name for t in fig.data)


def test_after_stop_the_visitor_may_start_again():
    sessions = Sessions()
    sessions.reserve("a")
    assert sessions.busy("a") and not sessions.busy("b")
    sessions.stop("a")
    assert not sessions.busy("a")


def test_mjsd_cycle_lists_its_joint_checks_and_the_longest_passing_prefix():
    from dataclasses import replace

    from gumiho.trace import JointCheck

    cycle = replace(gumiho_trace().steps[0], joint=[JointCheck(1, 0.5, 0.6, 0.833, False),
                                                    JointCheck(2, 0.3, 0.2, 1.0, True),
                                                    JointCheck(3, 0.01, 0.1, 0.1, False)])
    text = render.cycle_markdown(cycle)
    assert "MJSD's joint check" in text
    rows = [line for line in text.splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert len(rows) == 3 and "← accepted" in rows[1] and "✗" in rows[0] and "✓ passes" in rows[1]
    assert render.joint_markdown(gumiho_trace().steps[0]) == ""
    trace = replace(gumiho_trace(), method="mjsd")
    trace.settings.approximate = "MJSD accepts by joint likelihood"
    assert "Approximate output" in render.trace_summary(trace)


def test_a_sized_cycle_shows_what_it_expected_against_what_was_accepted():
    from dataclasses import replace

    cycle = gumiho_trace().steps[0]
    assert "expected" not in render.cycle_markdown(cycle)
    text = render.cycle_markdown(replace(cycle, expected_accepted=1.37))
    assert f"1.37 draft tokens expected, {cycle.accept_length} accepted" in text
