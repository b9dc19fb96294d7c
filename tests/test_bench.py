"""Benchmark harness: metrics on synthetic traces, the automatic tree size, a tiny end-to-end run, bad input."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from app.bench import read_runs
from gumiho.bench.__main__ import bench_settings, build_parser, execute
from gumiho.bench.__main__ import main as bench_main
from gumiho.bench.datasets import DATASETS, DEFAULT_DIR, load_questions
from gumiho.acceptance import Acceptance
from gumiho.bench.harness import BenchSettings, make_variants, run_bench
from gumiho.bench.metrics import acceptance_counts, add_speedups, prefix_agreement, prompt_row, summarize
from gumiho.bench.reference import References
from gumiho.calibrate import accepted_prefix_ranks, calibrate
from gumiho.engine import GenerationConfig
from gumiho.profile import widest_tree
from gumiho.sampling import SamplingConfig
from gumiho.trace import CycleTrace, GenerationTrace, RunSettings, TraceNode
from gumiho.tree import TreeSettings

from .conftest import random_drafter, tiny_engine

ROOT = Path(__file__).resolve().parents[1]


def cycle(accepted: int, depth: int, nodes: list[TraceNode] | None = None, path: list[int] | None = None,
          fta: bool = False) -> CycleTrace:
    path = path or list(range(accepted + 1))
    return CycleTrace(index=0, accepted_nodes=path, accepted_tokens=[7] * accepted, bonus_token=1,
                      emitted=[7] * (accepted + 1), draft_ms=2.0, verify_ms=5.0, other_ms=1.0, tree_depth=depth,
                      fta_used=fta, nodes=nodes or [])


def trace(new_tokens: int, cycles: int, wall_s: float, token_ids: list[int] | None = None) -> GenerationTrace:
    return GenerationTrace(method="gumiho", model="m", prompt="p", prompt_tokens=3,
                           settings=RunSettings(sampling={}, tree={"top_k": 4, "total_tokens": 24}, fta_applied=False,
                                                max_new_tokens=new_tokens, chat=True, seed=0, device="cpu", threads=1),
                           token_ids=token_ids or list(range(new_tokens)), cycles=cycles, wall_s=wall_s,
                           prefill_ms=10.0, finish_reason="length")


# --- metrics ---------------------------------------------------------------------------------------------------------

def test_tau_counts_tokens_per_verification_forward_bonus_included():
    assert trace(new_tokens=10, cycles=3, wall_s=1.0).tau == 3.0
    assert trace(new_tokens=5, cycles=4, wall_s=1.0).tau == 1.0  # AR: one token per forward


def test_per_position_acceptance_and_chain_accuracy():
    # (accepted, tree depth): hits at d=1: 3 of 4 trees; d=2: 2 of 4; d=3: 1 of the 3 trees that reach depth 3.
    counts = acceptance_counts([cycle(2, 3), cycle(0, 3), cycle(3, 3), cycle(1, 2)], depths=4)
    assert [counts[f"reach_{d}"] for d in range(1, 5)] == [4, 4, 3, 0]
    assert [counts[f"hit_{d}"] for d in range(1, 5)] == [3, 2, 1, 0]
    # chain_d's denominator: trees reaching d whose first d - 1 drafts were accepted.
    assert [counts[f"open_{d}"] for d in range(1, 5)] == [4, 3, 2, 0]
    row = {"dataset": "x", "question_id": "1", "turn": 1, "temperature": 0.0, "seed": 0, "method": "gumiho",
           **prompt_row(trace(9, 4, 1.0), [cycle(2, 3), cycle(0, 3), cycle(3, 3), cycle(1, 2)], None)}
    ar = {**row, "method": "ar"}
    summary = summarize(pd.DataFrame([row, ar]))
    got = summary[(summary["method"] == "gumiho") & (summary["dataset"] == "x")].iloc[0]
    assert (got["accept_1"], got["accept_2"], got["accept_3"]) == (0.75, 0.5, pytest.approx(1 / 3))
    assert (got["chain_1"], got["chain_2"], got["chain_3"]) == (0.75, pytest.approx(2 / 3), 0.5)
    assert math.isnan(got["accept_7"])  # no tree reached depth 7
    # Time shares: prefill 10 ms + 4 cycles x (2 + 5 + 1) ms.
    assert got["draft_share"] == pytest.approx(8 / 42) and got["prefill_share"] == pytest.approx(10 / 42)


def test_equality_with_ar():
    assert prefix_agreement([1, 2, 3, 4], [1, 2, 3, 4]) == 1.0
    assert prefix_agreement([1, 2, 9, 4], [1, 2, 3, 4]) == 0.5
    assert prefix_agreement([1, 2], [1, 2, 3, 4]) == 0.5
    assert prefix_agreement([], []) == 1.0
    ar = trace(4, 4, 1.0, [1, 2, 3, 4])
    assert prompt_row(trace(4, 2, 1.0, [1, 2, 3, 4]), [], ar)["same_as_ar"] is True
    row = prompt_row(trace(4, 2, 1.0, [1, 2, 9, 4]), [], ar)
    assert row["same_as_ar"] is False and row["agreement"] == 0.5


def test_speedup_is_the_mean_of_per_prompt_ratios_and_mean_row_averages_datasets():
    rows = []
    for dataset, question, ar_tps, g_tps, tau in [("a", "1", 10, 20, 3.0), ("a", "2", 20, 30, 2.0),
                                                   ("b", "1", 10, 40, 4.0)]:
        key = {"dataset": dataset, "question_id": question, "turn": 1, "temperature": 0.0, "seed": 0}
        for method, tps, t in (("ar", ar_tps, 1.0), ("gumiho", g_tps, tau)):
            rows.append({**key, "method": method, **prompt_row(trace(10, 3, 10 / tps), [], None), "tau": t})
    per_prompt = add_speedups(pd.DataFrame(rows))
    assert per_prompt.loc[per_prompt["method"] == "gumiho", "speedup"].tolist() == pytest.approx([2.0, 1.5, 4.0])
    summary = summarize(pd.DataFrame(rows)).set_index(["method", "dataset"])
    assert summary.at[("gumiho", "a"), "speedup"] == pytest.approx(1.75)  # not 50/30, the ratio of the means
    assert summary.at[("gumiho", "b"), "speedup"] == pytest.approx(4.0)
    assert summary.at[("gumiho", "mean"), "speedup"] == pytest.approx((1.75 + 4.0) / 2)
    assert summary.at[("gumiho", "mean"), "tau"] == pytest.approx((2.5 + 4.0) / 2)
    assert summary.at[("ar", "mean"), "speedup"] == 1.0 and summary.at[("gumiho", "mean"), "prompts"] == 3


# --- acceptance statistics (the automatic tree's input) ----------------------------------------------------------

def test_accepted_prefix_ranks_follow_the_score_order():
    scores = [0.0, -0.1, -0.5, -0.2, -0.3, -0.2]  # ranks by score (ties: lower id first): 1, 3, 5, 4, 2
    nodes = [TraceNode(i, 0, "", -1 if i == 0 else 0, 1, s, "x") for i, s in enumerate(scores)]
    c = cycle(3, 3, nodes=nodes, path=[0, 3, 2, 5])  # ranks 1, 4, 2 -> running max 1, 4, 4
    assert accepted_prefix_ranks(c) == [1, 4, 4]
    # A tree of n nodes keeps the n - 1 best: n = 3 keeps ranks 0-1 (one accepted), n = 6 keeps all three.
    assert [Acceptance({4: [[1, 4, 4]]}).tau(4, n) for n in (2, 3, 5, 6)] == [1.0, 2.0, 2.0, 4.0]


def test_counterfactual_tau_matches_real_smaller_trees():
    """The first cycle's accepted length with total_tokens = n equals the one predicted from the widest tree."""
    engine = tiny_engine()
    prompt = "w3 w5 w1 w9"
    for method in ("gumiho", "eagle2"):
        acceptance = calibrate(engine, method, top_ks=(4,), prompts=(prompt,), max_new_tokens=2, progress=False)
        first = acceptance.prefix_ranks[4][0]
        widest = widest_tree(method, 4)
        for n in (2, 4, 8, 16, 24):
            config = GenerationConfig(max_new_tokens=64, sampling=SamplingConfig(temperature=0.0), trace=False,
                                      tree=TreeSettings(**{**widest.to_dict(), "total_tokens": n}))
            real = next(iter(engine.run(prompt, method, config)))
            assert real.accept_length == sum(r < n - 1 for r in first), (method, n)


def test_generate_cli_prints_the_automatic_choice_and_flags_override_it(monkeypatch, capsys):
    from gumiho import loader
    from gumiho.__main__ import main
    from gumiho.choice import choose
    from gumiho.tree import LOOKUP_BRANCHES

    from .test_profile import deep_acceptance, flat_profile

    engine = tiny_engine()
    engine.choice = choose(flat_profile("float32"), ["ar", "eagle2", "gumiho"], "gumiho",
                           {"eagle2": deep_acceptance(), "gumiho": deep_acceptance()}, "cpu")
    monkeypatch.setattr(loader, "build_engine", lambda *a, **k: engine)
    chosen = engine.choice.methods["eagle2"].tree
    assert main(["generate", "--prompt", "w1 w2", "--method", "eagle2", "--max-new-tokens", "4", "--json"]) == 0
    out, err = capsys.readouterr()
    assert "[auto] fp32, lean forward, EAGLE-2 tree" in err
    record = json.loads(out)
    assert record["settings"]["tree"] == chosen.to_dict() and record["settings"]["choice"].startswith("fp32")
    assert main(["generate", "--prompt", "w1 w2", "--method", "eagle2", "--max-new-tokens", "4", "--json",
                 "--total-tokens", "5"]) == 0
    record = json.loads(capsys.readouterr().out)
    fixed = {k: v for k, v in chosen.to_dict().items() if k != "sized"}  # a fixed size is not sized per cycle
    # and takes prompt lookup's branches, which the sized tree goes without (design.md §17.5)
    assert record["settings"]["tree"] == {**fixed, "total_tokens": 5, "lookup_branches": LOOKUP_BRANCHES}


def test_the_six_benchmark_sets_ship_with_the_repository():
    assert DEFAULT_DIR == ROOT / "data" / "benchmarks"
    for name in DATASETS:
        questions = load_questions(name)
        assert len(questions) == 80 and len({q.question_id for q in questions}) == 80, name
    assert all(len(q.turns) == 2 for q in load_questions("mt_bench"))


# --- end to end ------------------------------------------------------------------------------------------------------

def test_tiny_end_to_end_run_writes_well_formed_results(tmp_path, monkeypatch):
    from gumiho import tree

    # A 16-word vocabulary repeats itself at once: the switch to prompt lookup would take every cycle, and this test
    # times the drafters' own parts.
    monkeypatch.setattr(tree, "LOOKUP_MERGE", 0)
    argv = ["--datasets", "mt_bench", "gsm8k", "--limit", "1", "--max-new-tokens", "8", "--out", str(tmp_path),
            "--name", "tiny", "--cost-repeats", "1", "--no-progress", "--total-tokens", "16",
            "--methods", "ar", "eagle1", "eagle2", "gumiho", "gumiho+fta", "mjsd"]
    args = build_parser().parse_args(argv)
    engine = tiny_engine()
    engine.add_drafter("mjsd", random_drafter("mjsd", engine.target))
    paths = execute(engine, args, argv, bench_settings(args))
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["tiny.json", "tiny.summary.csv", "tiny.per_prompt.csv", "tiny.profile.csv", "tiny.md"])
    result = json.loads(paths["json"].read_text())
    assert result["schema"] == 1 and result["name"] == "tiny" and result["machine"]["threads"] >= 1
    assert [v["name"] for v in result["variants"]] == ["ar", "eagle1", "eagle2", "gumiho", "gumiho+fta", "mjsd"]
    assert all(v["tree"]["total_tokens"] == 16 for v in result["variants"] if v["tree"] and v["method"] != "mjsd")
    assert result["cost_curve"]["sizes"][:3] == [1, 2, 4] and len(result["cost_curve"]["ms"]) == 11
    per_prompt = pd.read_csv(paths["per_prompt"])
    assert len(per_prompt) == 2 * 6 and set(per_prompt["dataset"]) == {"mt_bench", "gsm8k"}
    assert (per_prompt["perplexity"] >= 1).all()
    exact_rows = per_prompt[per_prompt["method"].isin(["ar", "eagle1", "eagle2", "gumiho"])]
    assert exact_rows.groupby(["dataset"])["perplexity"].nunique().max() == 1  # the same text, the same perplexity
    assert (per_prompt["new_tokens"] <= 8).all() and (per_prompt["tau"] >= 1).all()
    assert (per_prompt.loc[per_prompt["method"] == "ar", "speedup"] == 1.0).all()
    exact = per_prompt[per_prompt["method"].isin(["eagle1", "eagle2", "gumiho"])]
    assert exact["same_as_ar"].all()  # greedy speculative decoding without FTA returns AR's tokens
    summary = pd.read_csv(paths["summary"])
    assert set(summary["dataset"]) == {"mt_bench", "gsm8k", "mean"} and len(summary) == 3 * 6
    assert summary["tau"].notna().all() and summary["speedup"].notna().all()
    assert result["summary"] == json.loads(summary.to_json(orient="records"))
    profile = pd.read_csv(paths["profile"]).set_index("method")
    assert profile.at["gumiho", "draft_mlp_heads"] > 0 and profile.at["eagle2", "draft_mlp_heads"] == 0
    assert profile.at["ar", "draft_lm_head_rows"] == 0 and profile.at["eagle2", "draft_lm_head_rows"] == 1 + 5 * 4
    assert profile.at["gumiho", "draft_lm_head_rows"] == 1 + 4 + 5 * 4  # serial-1, serial-2 (k rows), 5 heads x k
    markdown = paths["markdown"].read_text()
    assert "## FTA trade-off (T = 0)" in markdown and "## Verification cost curve" in markdown
    assert "MJSD (approximate) against AR: output perplexity under the target" in markdown
    speed = markdown.split("## T = 0: speed-up over AR and τ")[1].split("###")[0]
    assert "| EAGLE |" in speed and "MJSD" not in speed  # the lossy method is reported apart
    header = "| Method | MT-Bench speed-up | MT-Bench τ | GSM8K speed-up | GSM8K τ | Mean speed-up | Mean τ |"
    assert header in markdown


def test_a_stopped_run_resumes_from_its_journal_and_matches_an_uninterrupted_run(tmp_path, monkeypatch, capsys):
    from gumiho.bench import harness
    from gumiho.errors import GumihoError

    engine = tiny_engine()
    argv = ["--datasets", "mt_bench", "gsm8k", "--limit", "2", "--max-new-tokens", "6", "--name", "run",
            "--cost-repeats", "1", "--no-progress", "--no-profile", "--total-tokens", "auto", "--tree-top-k", "2",
            "--methods", "ar", "eagle2", "gumiho", "gumiho+fta"]

    def bench(out: Path, *extra: str) -> dict[str, Path]:
        args = build_parser().parse_args(argv + ["--out", str(out), *extra])
        return execute(engine, args, argv, bench_settings(args))

    whole = pd.read_csv(bench(tmp_path / "whole")["per_prompt"])

    real, calls, stops = harness.run_conversation, [], [3]

    def stop_at_third(*a, **k):  # Ctrl-C during the third conversation of the first attempt
        calls.append(a[2].question_id)
        if len(calls) in stops:
            stops.clear()
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(harness, "run_conversation", stop_at_third)
    out = tmp_path / "split"
    with pytest.raises(KeyboardInterrupt):
        bench(out)
    journal = out / "run.partial.jsonl"
    lines = [json.loads(line) for line in journal.read_text().splitlines()]
    # These conversations last milliseconds, so a busy test machine can make one look disturbed: give every one
    # the same CPU share, so that only the disturbance this test makes below counts.
    lines = [dict(line, cpu_s=line["wall_s"]) if "job" in line else line for line in lines]
    journal.write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert "identity" in lines[0] and [line["job"][0] for line in lines if "job" in line] == ["mt_bench"] * 2
    assert lines[0]["setup"]["trees"]["gumiho"]["top_k"] == 2  # the automatic choice is kept for the resumed part
    (progress,) = read_runs(out)  # the app's Benchmarks tab shows the run in progress
    assert progress.name == "run (in progress)" and set(progress.summary["dataset"]) == {"mt_bench", "mean"}
    assert progress.summary.set_index(["method", "dataset"]).at[("ar", "mt_bench"), "prompts"] == 2
    assert "| Method | MT-Bench speed-up | MT-Bench τ | Mean speed-up | Mean τ |" in progress.report
    done = "2 of 4 conversations done (mt_bench: 2/2, gsm8k: 0/2); "
    assert done in progress.notes[0] and "gumiho+fta --resume`." in progress.notes[0]
    assert bench_main(argv + ["--out", str(out), "--status"]) == 0  # the same from the command line, with the table
    printed = capsys.readouterr().out
    assert done in printed and "about " in printed and "| Gumiho + FTA |" in printed

    with pytest.raises(GumihoError, match=r"holds an unfinished run \(2 conversations done\): add --resume"):
        bench(out)
    with pytest.raises(GumihoError, match="cannot resume .* started with other settings"):
        bench(out, "--resume", "--max-new-tokens", "5")

    # The first conversation got a fraction of its CPU time (another program was busy): it is measured again.
    disturbed = dict(lines[2], cpu_s=0.0)
    # And the process died while writing its next line: that torn line is cut off when the run resumes.
    journal.write_text("\n".join(json.dumps(line) for line in [lines[0], lines[1], disturbed, *lines[3:]])
                       + '\n{"job": ["gsm8k", "0", 0.0, 0], "segment": 0, "t": 12.5, "ro')
    assert "1 of 4 conversations done (mt_bench: 1/2, gsm8k: 0/2); 1 disturbed" in read_runs(out)[0].notes[0]
    calls.clear()
    paths = bench(out, "--resume")
    assert calls == [disturbed["job"][1], "0", "1"] and not journal.exists()  # and the two unfinished ones
    result = json.loads(paths["json"].read_text())
    assert result["segments"] == 2 and "--resume" not in result["command"]
    assert result["cost_curve"] == lines[0]["setup"]["cost_curve"] and result["load"]["own_cpu_share"] > 0
    assert "over 2 resumed processes" in paths["markdown"].read_text()
    split = pd.read_csv(paths["per_prompt"])
    columns = ["dataset", "question_id", "method", "new_tokens", "same_as_ar"]  # the auto tree may differ
    assert len(split) == 4 * 4 and split[columns].equals(whole[columns])
    chosen = {m: lines[0]["setup"]["trees"][m]["total_tokens"] for m in ("eagle2", "gumiho")}
    drafted = split[split["method"] != "ar"]
    assert (drafted["total_tokens"] == drafted["method"].str.split("+").str[0].map(chosen)).all()


def test_run_matrix_both_turns_temperatures_and_seeds(tmp_path):
    engine = tiny_engine()
    engine.target.tokenizer.chat_template = ("{% for m in messages %}{{ m['role'] }} {{ m['content'] }} {% endfor %}"
                                             "{% if add_generation_prompt %}w1{% endif %}")
    data = tmp_path / "two.jsonl"
    data.write_text(json.dumps({"question_id": 7, "turns": ["w2 w3", "w4 w5"]}) + "\n")
    settings = BenchSettings(datasets=[str(data)], max_new_tokens=4, temperatures=(0.0, 1.0), seeds=(0, 1),
                             warmup=0, both_turns=True)
    trees = {m: TreeSettings.default(m) for m in ("eagle2", "gumiho")}
    names = ["ar", "eagle2", "gumiho", "gumiho+fta"]
    rows = run_bench(engine, make_variants(names, trees), settings, progress=False)
    runs = rows.groupby(["temperature", "seed", "turn"])["method"].apply(sorted).to_dict()
    # T = 0 runs once (greedy ignores the seed) with FTA; T = 1 runs per seed, without the FTA variant.
    assert runs == {(0.0, 0, 1): sorted(names), (0.0, 0, 2): sorted(names),
                    **{(1.0, s, t): ["ar", "eagle2", "gumiho"] for s in (0, 1) for t in (1, 2)}}
    assert set(rows["dataset"]) == {"two"} and rows[rows["temperature"] == 1.0]["same_as_ar"].isna().all()
    assert rows[(rows["temperature"] == 0.0) & (rows["method"].isin(["eagle2", "gumiho"]))]["same_as_ar"].all()


def test_plain_transformers_generate_rows_equal_ar_and_give_vs_transformers():
    engine = tiny_engine(seed=4)
    reference = References(engine.target, None)  # the tiny model has no folder to load from
    trees = {m: TreeSettings.default(m) for m in ("eagle2", "gumiho")}
    variants = make_variants(["transformers", "ar", "gumiho"], trees, "float32")
    assert [v.name for v in variants] == ["transformers-fp32", "ar", "gumiho"]
    settings = BenchSettings(datasets=["mt_bench"], limit=2, max_new_tokens=12, warmup=0)
    rows = add_speedups(run_bench(engine, variants, settings, progress=False, reference=reference))
    plain = rows[rows["method"] == "transformers-fp32"]
    assert len(plain) == 2 and plain["same_as_ar"].all() and (plain["tau"] == 1.0).all()
    assert (plain["vs_transformers"] == 1.0).all()
    spec = rows[rows["method"] == "gumiho"].set_index("question_id")
    ref = plain.set_index("question_id")
    assert (spec["vs_transformers"] == spec["tokens_per_s"] / ref["tokens_per_s"]).all()
    assert summarize(rows)["vs_transformers"].notna().all()
    from gumiho.bench.breakdown import profile

    from gumiho.bench.breakdown import cycle_parts

    assert list(profile(engine, variants, "w1 w2", 6, rounds=1)["method"]) == ["ar", "gumiho"]  # no cycles to split
    # The prepared drafter runs its layers as a DecoderStack: their time is found and counted as draft_transformer.
    assert engine.drafters["gumiho"].lean is not None
    assert cycle_parts(engine, variants[-1], "w1 w2", 6)["draft_transformer"].sum() > 0


@pytest.mark.parametrize("args,message", [
    (["--datasets", "nope"], "unknown dataset 'nope'"),
    (["--methods", "beam"], "unknown method 'beam'"),
    (["--limit", "0"], "--limit: must be >= 1"),
    (["--total-tokens", "many"], "expected an integer or 'auto'"),
    (["--total-tokens", "0"], "--total-tokens must be >= 1"),
    (["--temperatures", "-1"], "temperatures must be >= 0"),
    (["--datasets", "/nonexistent/x.jsonl"], "cannot read dataset"),
    (["--datasets", "gsm8k", "mt_bench", "gsm8k"], "dataset 'gsm8k' is given twice"),
    (["--status", "--name", "never-ran"], "no run in progress at"),
    (["--methods", "ar", "llama.cpp", "--model", "some/other-model"], "llama.cpp"),
])
def test_bad_input_is_one_line_on_stderr(capsys, args, message):
    try:
        code = bench_main(args)
    except SystemExit as exc:  # argparse's usage errors
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2 and message in err and err.count("\n") == 1


@pytest.mark.slow
def test_cli_on_the_real_model(tmp_path):
    command = [sys.executable, "-m", "gumiho", "bench", "--datasets", "gsm8k", "--limit", "1", "--max-new-tokens",
               "8", "--methods", "ar", "gumiho", "--warmup", "0", "--cost-repeats", "1", "--no-profile",
               "--no-progress", "--out", str(tmp_path), "--name", "real"]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert "tau = (new_tokens - 1) / cycles" in done.stderr and "| Gumiho |" in done.stdout
    per_prompt = pd.read_csv(tmp_path / "real.per_prompt.csv")
    assert list(per_prompt["method"]) == ["ar", "gumiho"] and per_prompt["same_as_ar"].iloc[1]


def test_engine_check_reports_ratios_on_the_tiny_engine():
    from gumiho.bench.engine_check import check

    result = check(tiny_engine(), max_new_tokens=6, rounds=1, prompts=("w1 w2", "w3 w4 w5"), model=None)
    assert result["runs"] == 2 and result["device"] == "cpu"
    assert result["ar_over_generate"] > 0 and result["ar_tokens_per_s"] > 0
    assert math.isfinite(result["tracing_overhead"]) and result["tracing_overhead"] > -1


def test_a_torn_last_journal_line_is_cut_off_and_a_damaged_one_before_it_is_an_error(tmp_path):
    from gumiho.bench.journal import Journal
    from gumiho.errors import GumihoError

    path = tmp_path / "run.partial.jsonl"
    journal = Journal.open(path, {"run": 1}, resume=False)
    journal.begin({"command": "python -m gumiho bench"})
    journal.record(("mt_bench", "81", 0.0, 0), [{"tau": 2.0}], {"load": [], "wall_s": 1.0, "cpu_s": 1.0})
    with path.open("a") as f:
        f.write('{"job": ["mt_bench", "82", 0.0, 0], "rows": [{"ta')  # the process died mid-write
    resumed = Journal.open(path, {"run": 1}, resume=True)
    assert list(resumed.done) == [("mt_bench", "81", 0.0, 0)]
    resumed.begin()
    lines = path.read_text().splitlines()
    assert [json.loads(line).get("segment") for line in lines] == [None, 0, 0, 1]  # header, 2 segments, 1 job
    path.write_text("\n".join([lines[0], "{not json", *lines[1:]]) + "\n")
    with pytest.raises(GumihoError, match=r"line 2, is damaged: delete that line"):
        Journal.open(path, {"run": 1}, resume=True)
