"""Where a cycle's time goes, per method: the draft / verify / other split and the parts inside draft and verify.

The drafter's and the target's components are timed by temporarily shadowing their methods on the instances
(restored afterwards), so the engine runs unchanged. The first cycle is dropped (it follows the prefill). Each
variant runs a few times on one prompt, interleaved with the others; times are the mean over the fastest quarter
of the cycles (see `summarize_cycles`).

  draft_transformer   the draft decoder layers (every serial step / expansion)
  draft_fc            fusing token embeddings with features (fc 2H -> H)
  draft_lm_head       the draft's full-vocabulary head + log-softmax + top-k (`top_tokens`); draft_lm_head_rows
                      counts the rows it evaluated per cycle
  draft_mlp_heads     Gumiho's parallel MLP heads; Medusa's and Hydra's heads
  draft_rest          everything else in draft: beam bookkeeping, the pool, `build_tree`, FTA, Python
  verify_target       the target forward over the tree
  verify_lm_head      the target's lm_head over the tree's rows
  verify_rest         acceptance (argmax walk or rejection sampling)
"""

from __future__ import annotations

import time
from collections import defaultdict
from contextlib import contextmanager
from typing import Iterator

import pandas as pd

from ..engine import METHODS as ENGINE_METHODS, Engine, GenerationConfig, sync_device
from ..sampling import SamplingConfig
from .harness import Variant


def _components(engine: Engine, method: str) -> dict[str, tuple[object, str]]:
    parts: dict[str, tuple[object, str]] = {"verify_target": (engine.target, "features"),
                                            "verify_lm_head": (engine.target, "logits")}
    drafter = engine.drafters.get(method)
    if drafter is not None:
        parts["draft_lm_head"] = (drafter, "top_tokens")
        if hasattr(drafter, "transformer"):  # EAGLE and Gumiho; Medusa's and Hydra's heads read the target's feature
            # Prepared for inference, the draft layers run as a llama.DecoderStack (FeatureDrafter.use_lean).
            layers = (drafter.lean, "run") if drafter.lean is not None else (drafter.transformer, "forward")
            parts.update(draft_transformer=layers, draft_fc=(drafter.transformer, "fuse"))
        if hasattr(drafter, "heads"):  # Gumiho's MLP heads, Medusa's and Hydra's heads
            parts["draft_mlp_heads"] = (drafter.heads, "forward")
    return parts


@contextmanager
def instrumented(engine: Engine, method: str) -> Iterator[dict[str, float]]:
    """Accumulate ms per component (and `draft_lm_head_rows`) while the context is open."""
    totals: dict[str, float] = defaultdict(float)
    parts = _components(engine, method)
    device = engine.target.device

    def timed(part: str, function):
        def wrapper(*args, **kwargs):
            sync_device(device)
            start = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                sync_device(device)
                totals[part] += (time.perf_counter() - start) * 1e3
                if part == "draft_lm_head":
                    totals["draft_lm_head_rows"] += args[0].shape[:-1].numel()
        return wrapper

    for part, (owner, name) in parts.items():
        setattr(owner, name, timed(part, getattr(owner, name)))
    try:
        yield totals
    finally:
        for owner, name in parts.values():
            delattr(owner, name)  # the instance attribute goes; the class's method shows through again


PARTS = ("draft_transformer", "draft_fc", "draft_lm_head", "draft_lm_head_rows", "draft_mlp_heads", "verify_target",
         "verify_lm_head")


def cycle_parts(engine: Engine, variant: Variant, prompt: str, max_new_tokens: int) -> pd.DataFrame:
    """One row per cycle of a greedy generation (the first cycle excluded) with the ms of every part."""
    config = GenerationConfig(max_new_tokens=max_new_tokens, sampling=SamplingConfig(temperature=0.0),
                              trace=False, tree=variant.tree)
    run = engine.run(prompt, variant.method, config)
    rows = []
    with instrumented(engine, variant.method) as totals:
        before: dict[str, float] = {}
        for cycle in run:
            now = dict(totals)
            part_ms = {k: v - before.get(k, 0.0) for k, v in now.items()}
            before = now
            rows.append({"tree_size": cycle.tree_size, "tokens": len(cycle.emitted), "draft_ms": cycle.draft_ms,
                         "verify_ms": cycle.verify_ms, "other_ms": cycle.other_ms, **part_ms})
    frame = pd.DataFrame(rows[1:] or rows)
    for part in PARTS:
        if part not in frame:
            frame[part] = 0.0
    frame = frame.fillna(0.0)
    frame["draft_rest"] = frame["draft_ms"] - frame[["draft_transformer", "draft_fc", "draft_lm_head",
                                                     "draft_mlp_heads"]].sum(axis=1)
    frame["verify_rest"] = frame["verify_ms"] - frame["verify_target"] - frame["verify_lm_head"]
    frame["cycle_ms"] = frame[["draft_ms", "verify_ms", "other_ms"]].sum(axis=1)
    return frame


def summarize_cycles(method: str, frame: pd.DataFrame) -> dict:
    """Times: the mean over the fastest quarter of the cycles (other jobs only ever add time, so these are the
    cycles least disturbed by a shared machine); tau_cycle: tokens per cycle over all cycles."""
    fast = frame.nsmallest(max(1, len(frame) // 4), "cycle_ms")
    return {"method": method, "cycles": len(frame), "tau_cycle": frame["tokens"].mean(),
            **fast.drop(columns="tokens").mean().to_dict()}


def profile(engine: Engine, variants: list[Variant], prompt: str, max_new_tokens: int, rounds: int = 2) -> pd.DataFrame:
    """Every engine variant `rounds` times on one prompt, interleaved; one summary row per variant (the transformers
    reference has no cycles to break down)."""
    variants = [v for v in variants if v.method in ENGINE_METHODS]
    frames: dict[str, list[pd.DataFrame]] = {v.name: [] for v in variants}
    for _ in range(rounds):
        for variant in variants:
            frames[variant.name].append(cycle_parts(engine, variant, prompt, max_new_tokens))
    return pd.DataFrame([summarize_cycles(name, pd.concat(parts, ignore_index=True)) for name, parts in frames.items()])
