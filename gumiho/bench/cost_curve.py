"""The verification cost curve a benchmark report shows: T(n), one target forward over n tree tokens with a tree
mask on top of a KV cache, plus the lm_head over the n rows and the argmax, on the engine's own execution path
(lower quartile of a few interleaved repeats; the same timer as the machine profile's). The automatic tree choice
itself lives in `gumiho/choice.py`."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from tqdm import tqdm

from ..profile import VerifyTimer, low
from ..target import Target

SIZES = (1, 2, 4, 8, 12, 16, 20, 24, 32, 40, 48)


@dataclass
class CostCurve:
    """Ms of one verification step per tree size n (lower quartile), measured on `device` with `threads` threads."""

    device: str
    threads: int
    kv_length: int
    sizes: list[int]
    ms: list[float]


def measure_cost_curve(target: Target, sizes: tuple[int, ...] = SIZES, kv_length: int = 300, repeats: int = 5,
                       progress: bool = True) -> CostCurve:
    """Sizes are interleaved within each repeat so that drift on a shared machine hits them alike; repeat 0 warms
    up and is not kept."""
    timer = VerifyTimer(target, kv_length)
    times: dict[int, list[float]] = {n: [] for n in sizes}
    steps = [(r, n) for r in range(repeats + 1) for n in sizes]
    for r, n in tqdm(steps, desc="cost curve", disable=not progress, leave=False):
        ms = timer(n)
        if r:
            times[n].append(ms)
    return CostCurve(device=str(target.device), threads=torch.get_num_threads(), kv_length=kv_length,
                     sizes=list(sizes), ms=[low(times[n]) for n in sizes])
