"""What a verification forward costs inside the decoding loop, against the same forwards back to back: the target's
forward (the lm_head left out) by tree size, in the method's own runs at its automatic tree, where a random half of
the cycles that drafted verify the root alone instead. Both kinds of cycle then share the runs, the prompts and the
host's state, which drifts too much on a shared machine for separate runs to compare (docs/benchmarks.md, "A
verification inside the loop").

    PYTHONPATH=. .venv/bin/python scripts/in_situ_costs.py --prompts 2 --method gumiho
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections import defaultdict
from unittest import mock

import torch

from gumiho.engine import GenerationConfig, Run
from gumiho.loader import build_engine
from gumiho.tree import build_tree

from scripts.engine_ab import benchmark_prompts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=2, help="first prompts of each set (CNN/DM left out)")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--method", default="gumiho")
    args = parser.parse_args()
    engine = build_engine(threads=2)
    target = engine.target
    coin = random.Random(0)
    forwards: dict[tuple[int, bool], list[float]] = defaultdict(list)  # (tree size, root forced) -> ms
    forced = False
    sized, features = Run._sized, target.features

    def maybe_root(run: Run, root: int, pool, most: int, kv: int, sizer):
        nonlocal forced
        forced = bool(pool.size) and run.drafter is not None and not run._waiting and coin.random() < 0.5
        if forced:
            return build_tree(root, pool, 1, target.device), pool, sizer, None
        return sized(run, root, pool, most, kv, sizer)

    def timed(ids, cache, *rest, **options):
        nonlocal forced
        start = time.perf_counter()
        out = features(ids, cache, *rest, **options)
        if not options.get("prefill"):
            forwards[(ids.shape[0], forced)].append((time.perf_counter() - start) * 1e3)
        forced = False
        return out

    # A long prompt's cache makes every forward slower: CNN/DM is left out so that the sizes compare like for like.
    prompts = [prompt for name, prompt in benchmark_prompts(args.prompts) if name != "sum"]
    config = GenerationConfig(max_new_tokens=args.tokens, trace=False)
    with mock.patch.object(target, "features", timed), mock.patch.object(Run, "_sized", maybe_root):
        for prompt in prompts:
            engine.generate(prompt, args.method, config)
    one = statistics.median(forwards[(1, True)])
    print("| cycle | tree size n | forwards | median ms | over the root-only forward |\n|---|---|---|---|---|")
    for (n, root_only), times in sorted(forwards.items()):
        if len(times) >= 10:
            print(f"| {'root only (drafted)' if root_only else 'sized'} | {n} | {len(times):,} | "
                  f"{statistics.median(times):.2f} | {statistics.median(times) / one:.2f} |")

    # The same forwards back to back on one cache, sizes interleaved: as `profile.VerifyTimer` times them, but on a
    # real prompt's cache and without its lm_head row, so that they compare with the forwards timed above.
    ids = torch.tensor(target.encode_prompt(prompts[0]))
    back: dict[int, list[float]] = defaultdict(list)
    with torch.inference_mode():
        cache = target.new_cache()
        features(ids, cache, prefill=True)
        length = cache.length
        for _ in range(30):
            for n in (1, 2, 4):
                mask = torch.cat([torch.ones(n, length, dtype=torch.bool), torch.ones(n, n, dtype=torch.bool).tril()],
                                 1)[None, None] if n > 1 else None
                start = time.perf_counter()
                features(torch.randint(100, 1000, (n,)), cache, torch.arange(length, length + n), mask)
                back[n].append((time.perf_counter() - start) * 1e3)
                cache.length = length
    t1 = statistics.median(back[1])
    print(f"back to back at {length} cached tokens: " + ", ".join(
        f"n = {n} {statistics.median(ms):.2f} ms ({statistics.median(ms) / t1:.2f})" for n, ms in back.items()))


if __name__ == "__main__":
    main()
