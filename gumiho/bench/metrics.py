"""Benchmark metrics: per-prompt rows from traces, and their aggregation into per-method, per-dataset summaries.

Definitions (printed by the CLI and written into the results):
  tau            tokens emitted per target verification forward, bonus token included:
                 (new_tokens - 1) / cycles (the prefill forward emits the first token). AR: 1. Averaged over prompts.
  speedup        per prompt, the method's tokens/s over AR's tokens/s on the same prompt, temperature and seed in
                 the same run (methods interleaved); then the mean of those ratios. tokens/s = new_tokens / wall
                 time of the whole generation, prefill included. vs_eagle2: the same against EAGLE-2.
                 vs_transformers: the same against the fastest plain `transformers` `model.generate` row run on
                 that prompt (transformers-fp32 / -bf16 / -fp16, whichever were benchmarked).
  accept_d       per-position acceptance: among cycles whose tree reached depth d, the share that accepted at
                 least d draft tokens. Trees differ in depth from cycle to cycle, so each depth has its own
                 denominator and the sequence need not fall (it does in practice).
  chain_d        getkacc-style chain accuracy: among cycles whose tree reached depth d and that accepted the
                 first d - 1 draft tokens, the share that also accepted the d-th.
  draft / verify / other / prefill share   each part's share of the summed wall time of all prompts.
  same_as_ar     at T = 0: the share of prompts whose token ids equal AR's exactly.
  agreement      at T = 0: the common prefix of the method's and AR's token ids over the longer of the two,
                 averaged over prompts (1.0 = identical).
  perplexity     the output's perplexity under the target (T = 1, no filter; gumiho/perplexity.py), averaged over
                 prompts: how likely the target finds what a method wrote. The measure of a lossy method (MJSD).
"""

from __future__ import annotations

from typing import Iterable

import pandas as pd

from ..trace import CycleTrace, GenerationTrace

DEPTHS = 7
TAU_DEFINITION = ("tau = (new_tokens - 1) / cycles: tokens emitted per target verification forward, bonus token "
                  "included (AR = 1); the paper's code divides by cycles - 1 instead")
KEYS = ["dataset", "question_id", "turn", "temperature", "seed"]


def acceptance_counts(cycles: Iterable[CycleTrace], depths: int = DEPTHS) -> dict[str, int]:
    """reach_d: cycles whose tree reached depth d; open_d: of those, cycles that accepted >= d - 1 tokens;
    hit_d: cycles that accepted >= d tokens."""
    counts = {f"{name}_{d}": 0 for name in ("reach", "open", "hit") for d in range(1, depths + 1)}
    for cycle in cycles:
        length = cycle.accept_length
        for d in range(1, min(cycle.tree_depth, depths) + 1):
            counts[f"reach_{d}"] += 1
            counts[f"open_{d}"] += length >= d - 1
            counts[f"hit_{d}"] += length >= d
    return counts


def prefix_agreement(ids: list[int], reference: list[int]) -> float:
    """Length of the common prefix over the longer sequence (1.0 when both are empty)."""
    longest = max(len(ids), len(reference))
    if not longest:
        return 1.0
    same = 0
    for a, b in zip(ids, reference):
        if a != b:
            break
        same += 1
    return same / longest


def prompt_row(trace: GenerationTrace, cycles: list[CycleTrace], reference: GenerationTrace | None,
               perplexity: float | None = None) -> dict:
    """The per-prompt measurements of one generation; `reference` is AR's trace at T = 0 (else None)."""
    tree = trace.settings.tree or {}
    row = {
        "new_tokens": trace.new_tokens,
        "cycles": trace.cycles,
        "tau": trace.tau,
        "wall_s": trace.wall_s,
        "tokens_per_s": trace.tokens_per_s,
        "prefill_ms": trace.prefill_ms,
        "draft_ms": sum(c.draft_ms for c in cycles),
        "verify_ms": sum(c.verify_ms for c in cycles),
        "other_ms": sum(c.other_ms for c in cycles),
        "top_k": tree.get("top_k", 0),
        "total_tokens": tree.get("total_tokens", 1),
        "fta": trace.settings.fta_applied,
        "fta_cycles": sum(c.fta_used for c in cycles),
        "finish_reason": trace.finish_reason,
        "same_as_ar": None,
        "agreement": None,
        "perplexity": perplexity,
    }
    if reference is not None:
        row["same_as_ar"] = trace.token_ids == reference.token_ids
        row["agreement"] = prefix_agreement(trace.token_ids, reference.token_ids)
    row.update(acceptance_counts(cycles))
    return row


def add_speedups(per_prompt: pd.DataFrame) -> pd.DataFrame:
    """Add `speedup` (tokens/s over AR's), `vs_eagle2` (over EAGLE-2's) and `vs_transformers` (over the fastest
    transformers reference), each against the rows of the same dataset, question, turn, temperature and seed;
    NaN where that method did not run."""
    out = per_prompt.drop(columns=["speedup", "vs_eagle2", "vs_transformers"], errors="ignore")
    is_reference = per_prompt["method"].str.startswith("transformers-")
    for rows, column in ((per_prompt["method"] == "ar", "speedup"), (per_prompt["method"] == "eagle2", "vs_eagle2"),
                         (is_reference, "vs_transformers")):
        ref = per_prompt[rows].groupby(KEYS, as_index=False)["tokens_per_s"].max()
        out = out.merge(ref.rename(columns={"tokens_per_s": "_ref"}), on=KEYS, how="left")
        out[column] = out["tokens_per_s"] / out.pop("_ref")
    return out


def summarize(per_prompt: pd.DataFrame, depths: int = DEPTHS) -> pd.DataFrame:
    """One row per (temperature, method, dataset), plus dataset "mean": the unweighted mean of the dataset rows."""
    df = add_speedups(per_prompt)
    sums = df.groupby(["temperature", "method", "dataset"], sort=False)
    out = sums.agg(
        prompts=("tau", "size"),
        tau=("tau", "mean"),
        speedup=("speedup", "mean"),
        vs_eagle2=("vs_eagle2", "mean"),
        vs_transformers=("vs_transformers", "mean"),
        tokens_per_s=("tokens_per_s", "mean"),
        new_tokens=("new_tokens", "mean"),
        same_as_ar=("same_as_ar", lambda s: s.dropna().astype(float).mean()),
        agreement=("agreement", lambda s: s.dropna().astype(float).mean()),
        perplexity=("perplexity", lambda s: s.dropna().astype(float).mean()),
        total_tokens=("total_tokens", "first"),
        top_k=("top_k", "first"),
    )
    totals = sums[["prefill_ms", "draft_ms", "verify_ms", "other_ms", "cycles", "fta_cycles"]
                  + [f"{n}_{d}" for n in ("reach", "open", "hit") for d in range(1, depths + 1)]].sum()
    wall = totals[["prefill_ms", "draft_ms", "verify_ms", "other_ms"]].sum(axis=1)
    for part in ("prefill", "draft", "verify", "other"):
        out[f"{part}_share"] = totals[f"{part}_ms"] / wall
    out["fta_cycle_share"] = totals["fta_cycles"] / totals["cycles"]
    for d in range(1, depths + 1):
        out[f"accept_{d}"] = totals[f"hit_{d}"] / totals[f"reach_{d}"].where(totals[f"reach_{d}"] > 0)
        out[f"chain_{d}"] = totals[f"hit_{d}"] / totals[f"open_{d}"].where(totals[f"open_{d}"] > 0)
    out = out.reset_index()
    means = out.groupby(["temperature", "method"], sort=False).mean(numeric_only=True).reset_index()
    means["dataset"] = "mean"
    means["prompts"] = out.groupby(["temperature", "method"], sort=False)["prompts"].sum().values
    return pd.concat([out, means[out.columns]], ignore_index=True)
