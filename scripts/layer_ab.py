"""What a verification and a draft call cost on this checkout (docs/benchmarks.md, "One call per layer step").

T(n): the target forward over n tree tokens at 300 cached tokens (`--kv`: other lengths) plus the lm_head row and
argmax (`profile.VerifyTimer`), sizes interleaved, lower quartile. For a before/after, run it alternately here and in a
checkout of the earlier commit (`git worktree add /tmp/old <commit>`, then the same command from there), under
`bash scripts/campaign_hold.sh` while the drafter campaign runs.

`--draft`: one draft call (two newly accepted tokens after 256 cached, the tree built), the draft layers as a
`llama.DecoderStack` against the same drafter's modules, interleaved in one process; medians.

    PYTHONPATH=. .venv/bin/python scripts/layer_ab.py
    PYTHONPATH=. .venv/bin/python scripts/layer_ab.py --draft
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import replace

import torch

from gumiho.loader import build_engine
from gumiho.profile import VerifyTimer, low, widest_tree
from gumiho.tree import build_tree

DRAFTS = (("gumiho", 1, 2), ("eagle2", 3, 2), ("gumiho", 3, 4), ("eagle2", 3, 8))  # method, top_k, tree tokens


def verification(engine, repeats: int, kv: int) -> None:
    timer = VerifyTimer(engine.target, kv)
    times: dict[int, list[float]] = {n: [] for n in (1, 2, 4, 8)}
    for r in range(repeats + 1):
        for n in times:
            ms = timer(n)
            if r:  # the first round warms up
                times[n].append(ms)
    print(f"T(n) ms at {kv} cached tokens, lower quartile:", {n: round(low(v), 2) for n, v in times.items()})


@torch.inference_mode()
def drafts(engine, repeats: int) -> None:
    target = engine.target
    ids = torch.randint(1000, (260,), generator=torch.Generator().manual_seed(0))
    features = target.features(ids, target.new_cache(), prefill=True)
    for method, top_k, n in DRAFTS:
        drafter = engine.drafters[method]
        stack, tree = drafter.lean, replace(widest_tree(method, top_k), total_tokens=n)
        times: dict[str, list[float]] = {"stack": [], "modules": []}
        for _ in range(repeats):
            for name in times:
                drafter.lean = stack if name == "stack" else None
                drafter.reset()
                drafter.propose(features[:256], ids[1:257], tree)
                for _ in range(5):
                    start = time.perf_counter()
                    build_tree(int(ids[258]), drafter.propose(features[256:258], ids[257:259], tree), n, target.device)
                    times[name].append((time.perf_counter() - start) * 1e3)
                    drafter.cache.truncate(256)
        drafter.lean = stack
        drafter.reset()
        print(f"{method} top_k {top_k}, {n} tokens: draft ms, median:",
              {name: round(statistics.median(v), 3) for name, v in times.items()})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--draft", action="store_true", help="time draft calls, stack against modules")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--kv", type=int, nargs="+", default=[300], help="cached tokens before the tree (T(n))")
    args = parser.parse_args()
    engine = build_engine(threads=2)
    if args.draft:
        drafts(engine, args.repeats)
    else:
        for kv in args.kv:
            verification(engine, args.repeats, kv)


if __name__ == "__main__":
    main()
