"""Measure a drafter's acceptance statistics (`acceptance.py`): greedy runs with the widest tree of each top_k.

The prompts are never taken from the benchmark sets, so the automatic trees are not tuned on the evaluation data:
by default eight generic ones (`prompts.GENERIC_PROMPTS`); the shipped drafters' statistics come from these and 69
held-out task-shaped prompts (`--prompts data/calibration/prompts.jsonl`, its README). The statistics depend on the
drafter and the target only, so they ship with the drafter.
"""

from __future__ import annotations

from tqdm import tqdm

from .acceptance import Acceptance
from .engine import Engine, GenerationConfig
from .profile import TOP_KS, method_top_ks, widest_tree
from .prompts import GENERIC_PROMPTS as PROMPTS
from .sampling import SamplingConfig
from .static_tree import STATIC_METHODS
from .trace import CycleTrace


def accepted_prefix_ranks(cycle: CycleTrace, static: bool = False) -> list[int]:
    """Running maximum of the ranks (0 = best non-root node) of the accepted nodes, root excluded: by score, ties
    keeping the lower node id first as `tree.build_tree`'s stable sort does; in a static tree by node order (its
    official order). Needs a cycle recorded with its nodes."""
    order = range(1, len(cycle.nodes))
    if not static:
        order = sorted(order, key=lambda i: (-cycle.nodes[i].score, i))
    rank = {node: r for r, node in enumerate(order)}
    running, out = -1, []
    for node in cycle.accepted_nodes[1:]:
        running = max(running, rank[node])
        out.append(running)
    return out


def calibrate(engine: Engine, method: str, top_ks: tuple[int, ...] = TOP_KS, prompts: tuple[str, ...] = PROMPTS,
              max_new_tokens: int = 64, progress: bool = True) -> Acceptance:
    ranks: dict[int, list[list[int]]] = {}
    steps = [(k, p) for k in method_top_ks(method, top_ks) for p in prompts]
    for k, prompt in tqdm(steps, desc=f"calibrating {method}", disable=not progress, leave=False):
        tree = widest_tree(method, k)
        config = GenerationConfig(max_new_tokens=max_new_tokens, sampling=SamplingConfig(temperature=0.0), tree=tree)
        trace = engine.generate(prompt, method, config)
        ranks.setdefault(k, []).extend(accepted_prefix_ranks(c, method in STATIC_METHODS) for c in trace.steps)
    return Acceptance(ranks)
