"""Write a benchmark's results: `<name>.json` (everything), CSV tables and a Markdown report.

Files in the results folder (default `assets/bench/`), all named after the run (`--name`, e.g. `cpu-quick`):

  <name>.json              schema 1: {"schema", "name", "created", "command", "duration_s", "segments", "machine",
                           "load", "model", "drafters", "settings", "variants", "definitions", "summary",
                           "cost_curve", "auto_tree", "profile", "files"}; "segments" counts the processes of a
                           resumed run (1 otherwise); "summary" / "profile" are lists of the rows of the CSVs
                           below; "cost_curve" is {"device", "threads", "kv_length", "sizes", "ms"}; "auto_tree"
                           maps a method to {"method", "settings", "candidates", "cost_curve"} (empty when the
                           tree size was not chosen automatically)
  <name>.summary.csv       one row per (temperature, method, dataset), dataset "mean" = mean of the dataset rows:
                           prompts, tau, speedup, vs_eagle2, tokens_per_s, new_tokens, same_as_ar,
                           agreement, total_tokens, top_k, prefill/draft/verify/other_share, fta_cycle_share,
                           accept_1..7, chain_1..7
  <name>.per_prompt.csv    one row per (dataset, question_id, turn, temperature, seed, method): new_tokens, cycles,
                           tau, wall_s, tokens_per_s, speedup, vs_eagle2, prefill/draft/verify/other_ms
                           (summed over cycles), top_k, total_tokens, fta, fta_cycles, finish_reason,
                           same_as_ar, agreement, and the acceptance counts reach_d / open_d / hit_d
                           (d = 1..7; see metrics.acceptance_counts)
  <name>.profile.csv       mean ms per cycle of each part, per method (see gumiho/bench/breakdown.py)
  <name>.md                the Markdown tables (speed-up and tau per task, acceptance, FTA, time split, profile,
                           cost curve, automatic tree sizes)

Column meanings: `gumiho/bench/metrics.py`.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from ..trace import METHOD_NAMES
from .metrics import DEPTHS

TITLES = {"mt_bench": "MT-Bench", "humaneval": "HumanEval", "gsm8k": "GSM8K", "alpaca": "Alpaca", "sum": "CNN/DM",
          "qa": "Natural Qs", "mean": "Mean"}
NAMES = {**METHOD_NAMES, "ar": "AR (baseline)", "gumiho+fta": "Gumiho + FTA", "mjsd": "MJSD (lossy)",
         "transformers-fp32": "transformers generate fp32", "transformers-bf16": "transformers generate bf16",
         "transformers-fp16": "transformers generate fp16", "llama.cpp": "llama.cpp (same GGUF)"}
SCHEMA_VERSION = 1
LOSSY = ("mjsd",)  # reported apart from the exact methods: their speed buys a different output


def md(frame: pd.DataFrame) -> str:
    """A pipe table (no extra dependency): header, separator, rows."""
    cells = [[str(c) for c in frame.columns]] + [[str(v) for v in row] for row in frame.itertuples(index=False)]
    lines = ["| " + " | ".join(row) + " |" for row in cells]
    lines.insert(1, "|" + "---|" * len(frame.columns))
    return "\n".join(lines)


def speed_table(summary: pd.DataFrame, temperature: float) -> str:
    """Rows: methods (AR excluded); columns: speed-up over AR and tau for each task, and the mean; then the mean
    tokens/s and the mean speed-up over plain `transformers` generate, where it was benchmarked."""
    rows = summary[(summary["temperature"] == temperature) & ~summary["method"].isin(("ar", *LOSSY))]
    datasets = list(dict.fromkeys(rows["dataset"]))
    table = []
    for method, group in rows.groupby("method", sort=False):
        by = group.set_index("dataset")
        line = {"Method": NAMES.get(method, method)}
        for d in datasets:
            title = TITLES.get(d, d)
            line[f"{title} speed-up"] = f"{by.at[d, 'speedup']:.2f}x"
            line[f"{title} τ"] = f"{by.at[d, 'tau']:.2f}"
        if "vs_transformers" in by and by["vs_transformers"].notna().any():
            line["tokens/s"] = f"{by.at['mean', 'tokens_per_s']:.1f}"
            line["vs transformers"] = f"{by.at['mean', 'vs_transformers']:.2f}x"
        table.append(line)
    return md(pd.DataFrame(table))


def lossy_table(summary: pd.DataFrame, temperature: float) -> pd.DataFrame:
    """The lossy methods (MJSD) beside AR, per task: output perplexity under the target, τ, tokens/s and speed-up,
    and how much of AR's text they kept (T = 0)."""
    rows = summary[(summary["temperature"] == temperature) & summary["method"].isin(("ar", *LOSSY))]
    if not rows["method"].isin(LOSSY).any():
        return pd.DataFrame()
    table = rows.assign(method=rows["method"].map(lambda m: NAMES.get(m, m)),
                        dataset=rows["dataset"].map(lambda d: TITLES.get(d, d)))
    return table[["method", "dataset", "perplexity", "tau", "tokens_per_s", "speedup", "agreement"]].rename(
        columns={"dataset": "task", "tau": "τ", "tokens_per_s": "tokens/s", "speedup": "speed-up vs AR",
                 "agreement": "agreement with AR"}).reset_index(drop=True)


def fta_table(summary: pd.DataFrame) -> pd.DataFrame:
    """Greedy runs, per task: Gumiho without and with FTA (τ, its gain, speed-up, equality with AR)."""
    greedy = summary[summary["temperature"] == 0].set_index(["method", "dataset"])
    if not {"gumiho", "gumiho+fta"} <= set(greedy.index.get_level_values(0)):
        return pd.DataFrame()
    off, on = greedy.loc["gumiho"], greedy.loc["gumiho+fta"]
    return pd.DataFrame({
        "task": [TITLES.get(d, d) for d in off.index], "τ off": off["tau"], "τ on": on["tau"],
        "τ gain": on["tau"] / off["tau"], "speed-up off": off["speedup"], "speed-up on": on["speedup"],
        "same as AR off": off["same_as_ar"], "same as AR on": on["same_as_ar"], "agreement on": on["agreement"],
        "cycles through FTA": on["fta_cycle_share"],
    }).reset_index(drop=True)


def _fmt(frame: pd.DataFrame, digits: int = 2) -> pd.DataFrame:
    return frame.map(lambda v: f"{v:.{digits}f}" if isinstance(v, float) else v)


def detail_tables(summary: pd.DataFrame, temperature: float) -> dict[str, pd.DataFrame]:
    """Mean-over-tasks tables for one temperature: throughput, time split, acceptance, FTA/equality."""
    mean = summary[(summary["temperature"] == temperature) & (summary["dataset"] == "mean")].copy()
    mean["method"] = mean["method"].map(lambda m: NAMES.get(m, m))
    mean = mean.set_index("method")
    drafted = mean.drop(index=NAMES["ar"], errors="ignore")
    return {
        "throughput and time split (mean over tasks)": _fmt(mean[[
            "tokens_per_s", "speedup", "vs_eagle2", "vs_transformers", "tau", "total_tokens", "top_k", "prefill_share", "draft_share",
            "verify_share", "other_share"]].reset_index()),
        "per-position acceptance accept_d (mean over tasks)": _fmt(
            drafted[[f"accept_{d}" for d in range(1, DEPTHS + 1)]].reset_index()),
        "chain accuracy chain_d (mean over tasks)": _fmt(
            drafted[[f"chain_{d}" for d in range(1, DEPTHS + 1)]].reset_index()),
        "equality with AR (T = 0), FTA use and output perplexity": _fmt(
            mean[["same_as_ar", "agreement", "fta_cycle_share", "perplexity"]].reset_index()),
    }


def markdown(result: dict, summary: pd.DataFrame, profile: pd.DataFrame) -> str:
    m = result["machine"]
    parts = [
        f"# Benchmark `{result['name']}`",
        f"{m['description']}; {result['settings']['max_new_tokens']} new tokens, "
        f"{result['settings']['limit'] or 'all'} prompts per task; load: {result['load']['description']}; "
        f"took {result['duration_s'] / 60:.1f} min"
        + (f" over {result['segments']} resumed processes." if result.get("segments", 1) > 1 else "."),
        f"Command: `{result['command']}`",
        result["definitions"]["tau"] + ". " + result["definitions"]["speedup"],
    ]
    for temperature in sorted(summary["temperature"].unique()):
        parts += [f"## T = {temperature:g}: speed-up over AR and τ", speed_table(summary, temperature)]
        parts += [f"### {title}\n\n{md(t)}" for title, t in detail_tables(summary, temperature).items()]
        lossy = lossy_table(summary, temperature)
        if not lossy.empty:
            parts += [f"## T = {temperature:g}: MJSD (approximate) against AR: output perplexity under the target",
                      md(_fmt(lossy))]
    fta = fta_table(summary)
    if not fta.empty:
        parts += ["## FTA trade-off (T = 0)", md(_fmt(fta))]
    if not profile.empty:
        cols = ["method", "tree_size", "tau_cycle", "cycle_ms", "draft_ms", "verify_ms", "other_ms",
                "draft_transformer", "draft_fc", "draft_lm_head", "draft_lm_head_rows", "draft_mlp_heads",
                "draft_rest", "verify_target", "verify_lm_head", "verify_rest"]
        parts += ["## One cycle, per method (ms; mean of the fastest quarter of the cycles of greedy runs)",
                  md(_fmt(profile[cols], 1))]
    cost = result["cost_curve"]
    curve = pd.DataFrame({"tree tokens n": cost["sizes"], "T(n) ms": cost["ms"],
                          "x one decode step": [t / cost["ms"][0] for t in cost["ms"]]})
    parts += [f"## Verification cost curve ({cost['device']}, {cost['threads']} threads, "
              f"KV length {cost['kv_length']})", md(_fmt(curve))]
    for method, choice in result["auto_tree"].items():  # runs made before the machine profile
        top = pd.DataFrame(choice["candidates"]).head(8)
        s = choice["settings"]
        parts += [f"## Automatic tree size, {NAMES.get(method, method)}: top_k {s['top_k']}, "
                  f"total_tokens {s['total_tokens']} (best predicted candidates)", md(_fmt(top))]
    if result.get("choice"):
        choice = result["choice"]
        lines = [f"- {NAMES.get(m, m)}: " + (f"top_k {c['tree']['top_k']}, total_tokens {c['tree']['total_tokens']}, "
                                             if c["tree"] else "")
                 + f"expected {c['tokens_per_s']:.1f} tokens/s ({c['speedup']:.2f}x AR)"
                 + (f"; {c['note']}" if c["note"] else "") for m, c in choice["methods"].items()]
        path = choice["path"]
        parts += [f"## Automatic choice (machine profile): {path['dtype']}, {path['forward']} forward"
                  + (", packed matmuls" if path["pack"] else ""), choice["reason"], "\n".join(lines)]
    return "\n\n".join(parts) + "\n"


def write(folder: Path, result: dict, per_prompt: pd.DataFrame, summary: pd.DataFrame,
          profile: pd.DataFrame) -> dict[str, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    name = result["name"]
    paths = {"json": folder / f"{name}.json", "summary": folder / f"{name}.summary.csv",
             "per_prompt": folder / f"{name}.per_prompt.csv", "profile": folder / f"{name}.profile.csv",
             "markdown": folder / f"{name}.md"}
    result = {**result, "schema": SCHEMA_VERSION,
              "summary": json.loads(summary.to_json(orient="records")),
              "profile": json.loads(profile.to_json(orient="records")),
              "files": {k: p.name for k, p in paths.items() if k != "json"}}
    paths["json"].write_text(json.dumps(result, indent=1) + "\n")
    summary.to_csv(paths["summary"], index=False)
    per_prompt.to_csv(paths["per_prompt"], index=False)
    profile.to_csv(paths["profile"], index=False)
    paths["markdown"].write_text(markdown(result, summary, profile))
    return paths
