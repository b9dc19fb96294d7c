"""What a verification forward costs inside the decoding loop, against the machine profile's back-to-back figure:
the target's forward (the lm_head excluded) by tree size, per prompt interleaved over AR, the method at its automatic
tree, and the method with every tree cut to its root (the draft still computed, then discarded), so that the last
shows what a draft between two forwards does to the next one (docs/benchmarks.md, "A verification inside the loop").

    PYTHONPATH=. .venv/bin/python scripts/in_situ_costs.py --prompts 2 --method gumiho
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import defaultdict
from contextlib import nullcontext
from unittest import mock

import torch

from gumiho.engine import GenerationConfig, Run
from gumiho.loader import build_engine
from gumiho.profile import VerifyTimer
from gumiho.tree import build_tree

from scripts.engine_ab import benchmark_prompts


def root_only(run: Run, root: int, pool, most: int, kv: int, sizer):
    """`Run._sized` for a tree of the root alone, whatever was drafted."""
    return build_tree(root, pool, 1, run.engine.target.device), pool, sizer, None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=2, help="first prompts of each set (CNN/DM left out)")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--method", default="gumiho")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    engine = build_engine(threads=2)
    target = engine.target
    forwards: dict[tuple[str, int], list[float]] = defaultdict(list)
    variant = ""
    features = target.features

    def timed(ids, cache, *rest, **options):
        start = time.perf_counter()
        out = features(ids, cache, *rest, **options)
        if not options.get("prefill"):
            forwards[(variant, ids.shape[0])].append((time.perf_counter() - start) * 1e3)
        return out

    # A long prompt's cache makes every forward slower: CNN/DM is left out so that the sizes compare like for like.
    prompts = [prompt for name, prompt in benchmark_prompts(args.prompts) if name != "sum"]
    config = GenerationConfig(max_new_tokens=args.tokens, trace=False)
    with mock.patch.object(target, "features", timed):
        for _ in range(args.rounds):
            for prompt in prompts:
                for variant, method, patch in [("AR", "ar", None), (f"{args.method}, automatic", args.method, None),
                                               (f"{args.method}, root only", args.method, root_only)]:
                    with mock.patch.object(Run, "_sized", patch) if patch else nullcontext():
                        engine.generate(prompt, method, config)
    ar = statistics.median(forwards[("AR", 1)])
    print("| run | tree size n | forwards | median ms | over AR's one-token forward |\n|---|---|---|---|---|")
    for (name, n), times in sorted(forwards.items(), key=lambda item: (item[0][0] != "AR", item[0])):
        if len(times) >= 10:
            print(f"| {name} | {n} | {len(times):,} | {statistics.median(times):.2f} | "
                  f"{statistics.median(times) / ar:.2f} |")
    timer = VerifyTimer(target, 200)
    with torch.inference_mode():
        back = {n: statistics.median(timer(n) for _ in range(20)) for n in (1, 2, 4)}
    print("back to back (the profile's VerifyTimer, 200 cached tokens, one lm_head row): " +
          ", ".join(f"T({n}) {ms:.2f} ms ({ms / back[1]:.2f})" for n, ms in back.items()))


if __name__ == "__main__":
    main()
