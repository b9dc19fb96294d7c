"""Hardware-aware tree size: pick `total_tokens` (and `top_k`) that maximise expected tokens/s on this device.

EAGLE's rule (docs/design.md §11) times target forwards of n tokens and divides by *assumed* gains. Here both sides are
measured:

  cost curve   T(n): one verification step (target forward over n tree tokens with a tree mask on top of a
               realistic KV cache, plus the lm_head over the n rows and the argmax), the lower quartile of a
               few interleaved repeats per n;
  acceptance   a calibration run with the largest tree for each candidate top_k records, per cycle, the score
               ranks of the accepted nodes. The tree of total_tokens = n is exactly the best n - 1 nodes of that
               pool (`tree.build_tree`), so the accepted length it would have given is the number of leading
               accepted nodes whose running maximum rank is below n - 1 (exact for greedy decoding without FTA,
               given the same context). tau(n, k) = 1 + mean of that length;
  draft cost   D(k): lower quartile of the draft ms per cycle of the calibration run; O(k) the same for other ms.

Other jobs on a shared machine only ever add time, so every timing is summarised by its lower quartile.

expected tokens/s(n, k) = 1000 * tau(n, k) / (D(k) + T(n) + O(k)); the best pair wins. The calibration prompts
are generic and not taken from the benchmark sets, so the choice is not tuned on the evaluation data.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import pandas as pd
import torch
from tqdm import tqdm

from ..engine import Engine, GenerationConfig, sync_device
from ..packed import packing_enabled
from ..sampling import SamplingConfig
from ..target import Target, cache_root
from ..trace import CycleTrace
from ..tree import TreeSettings

SIZES = (2, 4, 8, 12, 16, 20, 24, 32, 40, 48)
TOP_KS = (3, 4, 6)
CALIBRATION_PROMPTS = (
    "Describe how a bicycle works, part by part.",
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "Explain the difference between a list and a tuple in Python, with examples.",
    "What are three good habits for staying healthy while working from home?",
)


@dataclass
class CostCurve:
    """Ms of one verification step per tree size n (lower quartile), measured on `device` with `threads` threads."""

    device: str
    threads: int
    kv_length: int
    sizes: list[int]
    ms: list[float]

    def at(self, n: int) -> float:
        """T(n), linearly interpolated between measured sizes (clamped at the ends)."""
        pairs = sorted(zip(self.sizes, self.ms))
        if n <= pairs[0][0]:
            return pairs[0][1]
        for (n0, t0), (n1, t1) in zip(pairs, pairs[1:]):
            if n <= n1:
                return t0 + (t1 - t0) * (n - n0) / (n1 - n0)
        return pairs[-1][1]


@torch.inference_mode()
def measure_cost_curve(target: Target, sizes: tuple[int, ...] = (1,) + SIZES, kv_length: int = 300,
                       repeats: int = 5, progress: bool = True) -> CostCurve:
    """Time a tree-masked target forward + lm_head + argmax for each n on top of a `kv_length`-token KV cache.

    Sizes are interleaved within each repeat so that drift on a shared machine hits them alike.
    """
    generator = torch.Generator().manual_seed(0)
    vocab = target.vocab_size
    prefix = torch.randint(vocab, (kv_length,), generator=generator).to(target.device)
    cache = target.new_cache()
    target.features(prefix, cache)
    times: dict[int, list[float]] = {n: [] for n in sizes}
    steps = [(r, n) for r in range(repeats + 1) for n in sizes]  # repeat 0 warms up and is not kept
    for r, n in tqdm(steps, desc="cost curve", disable=not progress, leave=False):
        tokens = torch.randint(vocab, (n,), generator=generator).to(target.device)
        mask = None
        if n > 1:
            chain = torch.ones(n, n, dtype=torch.bool).tril()
            mask = torch.cat([torch.ones(n, kv_length, dtype=torch.bool), chain], 1)[None, None].to(target.device)
        positions = torch.arange(kv_length, kv_length + n, device=target.device)
        sync_device(target.device)
        start = time.perf_counter()
        target.logits(target.features(tokens, cache, positions, mask)).argmax(-1).tolist()
        sync_device(target.device)
        if r:
            times[n].append((time.perf_counter() - start) * 1e3)
        cache.crop(-n)
    return CostCurve(device=str(target.device), threads=torch.get_num_threads(), kv_length=kv_length,
                     sizes=list(sizes), ms=[low(times[n]) for n in sizes])


def low(values: list[float]) -> float:
    """The lower quartile (the smallest value for fewer than four)."""
    return sorted(values)[len(values) // 4]


def accepted_prefix_ranks(cycle: CycleTrace) -> list[int]:
    """Running maximum of the score ranks (0 = best non-root node) of the accepted nodes, root excluded.

    Needs a cycle recorded with `trace=True` (its `nodes`). Ties keep the lower node id first, as `build_tree`'s
    stable sort does.
    """
    order = sorted(range(1, len(cycle.nodes)), key=lambda i: (-cycle.nodes[i].score, i))
    rank = {node: r for r, node in enumerate(order)}
    running, out = -1, []
    for node in cycle.accepted_nodes[1:]:
        running = max(running, rank[node])
        out.append(running)
    return out


def expected_tau(prefix_ranks: list[list[int]], n: int) -> float:
    """Mean tokens per cycle (bonus included) had each cycle's tree kept only its best n - 1 nodes."""
    if not prefix_ranks:
        return 1.0
    return 1.0 + sum(sum(r < n - 1 for r in ranks) for ranks in prefix_ranks) / len(prefix_ranks)


@dataclass
class Calibration:
    """What one calibration run measured for a tree shape."""

    settings: TreeSettings
    prefix_ranks: list[list[int]]
    draft_ms: float
    other_ms: float


def calibrate(engine: Engine, method: str, settings: TreeSettings, prompts: tuple[str, ...] = CALIBRATION_PROMPTS,
              max_new_tokens: int = 48) -> Calibration:
    """Greedy runs with the given (largest) tree, FTA off, recording accepted ranks and draft / other times."""
    config = GenerationConfig(max_new_tokens=max_new_tokens, sampling=SamplingConfig(temperature=0.0),
                              trace=True, tree=replace(settings, fta=False))
    cycles: list[CycleTrace] = []
    for prompt in prompts:
        cycles.extend(engine.generate(prompt, method, config).steps)
    return Calibration(
        settings=settings,
        prefix_ranks=[accepted_prefix_ranks(c) for c in cycles],
        draft_ms=low([c.draft_ms for c in cycles]),
        other_ms=low([c.other_ms for c in cycles]),
    )


@dataclass
class Candidate:
    """One (top_k, total_tokens) pair and its predicted throughput."""

    top_k: int
    total_tokens: int
    tau: float
    draft_ms: float
    verify_ms: float
    other_ms: float
    tokens_per_s: float
    speedup: float  # predicted, over one decode step (T(1)) per token


def rank_candidates(cost: CostCurve, calibrations: list[Calibration], sizes: tuple[int, ...] = SIZES,
                    method: str = "gumiho") -> list[Candidate]:
    """Every feasible (top_k, n) pair with its expected tokens/s, best first. Pure: no model involved."""
    candidates = []
    for cal in calibrations:
        limit = cal.settings.pool_size(method) + 1
        for n in sizes:
            if n > limit:
                continue
            tau = expected_tau(cal.prefix_ranks, n)
            verify_ms = cost.at(n)
            cycle_ms = cal.draft_ms + verify_ms + cal.other_ms
            candidates.append(Candidate(
                top_k=cal.settings.top_k, total_tokens=n, tau=tau, draft_ms=cal.draft_ms, verify_ms=verify_ms,
                other_ms=cal.other_ms, tokens_per_s=1e3 * tau / cycle_ms, speedup=tau * cost.at(1) / cycle_ms,
            ))
    return sorted(candidates, key=lambda c: (-c.tokens_per_s, c.total_tokens, c.top_k))


def top_ks_to_try(top_k: int | None) -> tuple[int, ...]:
    """The top_k candidates of an automatic choice: the one given, else TOP_KS."""
    return (top_k,) if top_k else TOP_KS


def shape_for(method: str, base: TreeSettings, top_k: int, total_tokens: int) -> TreeSettings:
    """`base` with another top_k and total_tokens; Gumiho's per-head candidates and pruning never fall below top_k."""
    if method == "gumiho":
        return replace(base, top_k=top_k, total_tokens=total_tokens, mlptopk=max(base.mlptopk, top_k),
                       pruning=max(base.pruning, top_k))
    return replace(base, top_k=top_k, total_tokens=total_tokens)


@dataclass
class TreeChoice:
    """The automatic choice for one method, with everything it was based on."""

    method: str
    settings: TreeSettings
    candidates: list[Candidate]
    cost: CostCurve

    def table(self) -> pd.DataFrame:
        return pd.DataFrame([asdict(c) for c in self.candidates])

    def to_dict(self) -> dict:
        return {"method": self.method, "settings": self.settings.to_dict(),
                "candidates": [asdict(c) for c in self.candidates], "cost_curve": asdict(self.cost)}

    @classmethod
    def from_dict(cls, data: dict) -> TreeChoice:
        return cls(method=data["method"], settings=TreeSettings(**data["settings"]),
                   candidates=[Candidate(**c) for c in data["candidates"]], cost=CostCurve(**data["cost_curve"]))


def auto_tree(engine: Engine, method: str, base: TreeSettings, cost: CostCurve | None = None,
              top_ks: tuple[int, ...] = TOP_KS, sizes: tuple[int, ...] = SIZES,
              prompts: tuple[str, ...] = CALIBRATION_PROMPTS, max_new_tokens: int = 48,
              progress: bool = True) -> TreeChoice:
    """Measure (or reuse) the cost curve, calibrate each top_k with its largest feasible tree, pick the best."""
    cost = cost or measure_cost_curve(engine.target, (1,) + tuple(sizes), progress=progress)
    calibrations = []
    for k in tqdm(top_ks, desc=f"calibrating {method}", disable=not progress, leave=False):
        widest = shape_for(method, base, k, 1)
        shape = replace(widest, total_tokens=min(max(sizes), widest.pool_size(method) + 1))
        calibrations.append(calibrate(engine, method, shape, prompts, max_new_tokens))
    candidates = rank_candidates(cost, calibrations, sizes, method)
    best = candidates[0]
    return TreeChoice(method=method, settings=shape_for(method, base, best.top_k, best.total_tokens),
                      candidates=candidates, cost=cost)


def cached_auto_tree(engine: Engine, method: str, base: TreeSettings, top_ks: tuple[int, ...] = TOP_KS,
                     progress: bool = True) -> TreeChoice:
    """`auto_tree`, remembered per model, drafter (by its weights: a retrained drafter in the same folder is
    calibrated again), device, thread count, packed matmuls on/off, base shape and top_k candidates in
    `$GUMIHO_CACHE/auto_tree.json`."""
    from .journal import weights_digest

    path = cache_root() / "auto_tree.json"
    base_key = {k: v for k, v in base.to_dict().items() if k not in ("top_k", "total_tokens")}
    key = json.dumps([engine.target.name, weights_digest(engine.drafters[method]), str(engine.target.device),
                      torch.get_num_threads(), packing_enabled(), method, base_key, list(top_ks)], sort_keys=True)
    store = _read_store(path)
    if key in store:
        return TreeChoice.from_dict(store[key])
    choice = auto_tree(engine, method, base, top_ks=top_ks, progress=progress)
    store[key] = choice.to_dict()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(store, indent=1))
    return choice


def _read_store(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return {}
    return data if isinstance(data, dict) else {}
