"""What a better first draft token would buy on the machine at hand: the shipped drafter, its draft computed and
timed as always, with a share q of its wrong first tokens replaced by the target's own next token (read from AR's
greedy reply to the same prompt). Its right ones stay, and so do its scores, so per-cycle sizing still sees a
drafter whose confidence means something; q = 0 is the drafter as shipped. Per prompt, AR and the method run
side by side for each q (the order rotated), every output checked against AR's (docs/benchmarks.md, "What a better
drafter would buy"). Evaluation only: the replaced tokens come from the reply being verified.

    PYTHONPATH=. .venv/bin/python scripts/accuracy_sweep.py --prompts 2 --fix 0 0.25 0.5
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections import defaultdict

import torch

from gumiho.engine import GenerationConfig
from gumiho.loader import build_engine
from gumiho.tree import DraftPool

from scripts.engine_ab import benchmark_prompts


class FirstTokenFix:
    """Wraps a feature drafter's `propose`: where its best first token is not `reply`'s next token, make it so
    with probability `q` (the sibling holding that token, if any, takes the old one: siblings stay distinct)."""

    def __init__(self, drafter, seed: int = 0):
        self.drafter, self.propose, self.coin = drafter, drafter.propose, random.Random(seed)
        self.sequence: list[int] = []
        self.q = 0.0
        self.right = self.drafted = 0

    def __call__(self, features: torch.Tensor, tokens: torch.Tensor, tree) -> DraftPool:
        root_at = self.drafter.cache.length + tokens.shape[0]  # the root's index in prompt + reply
        pool = self.propose(features, tokens, tree)
        if not pool.size or root_at + 1 >= len(self.sequence):
            return pool
        truth, first = self.sequence[root_at + 1], pool.tokens[0]
        self.drafted += 1
        if int(first[0]) != truth and self.coin.random() < self.q:
            same = (first == truth).nonzero()
            if len(same):
                first[int(same[0])] = first[0]
            first[0] = truth
        self.right += int(first[0]) == truth
        return pool


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=2, help="first prompts of each set")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--method", default="gumiho", choices=["gumiho", "eagle2"])
    parser.add_argument("--fix", type=float, nargs="+", default=[0.0, 0.25, 0.5], help="shares q of misses fixed")
    args = parser.parse_args()
    engine = build_engine(threads=2)
    target, drafter = engine.target, engine.drafters[args.method]
    fix = FirstTokenFix(drafter)
    drafter.propose = fix
    config = GenerationConfig(max_new_tokens=args.tokens, trace=False)
    ratios, taus, right = defaultdict(list), defaultdict(list), defaultdict(lambda: [0, 0])
    same = True
    for slot, (name, prompt) in enumerate(benchmark_prompts(args.prompts)):
        prompt_ids = target.encode_prompt(prompt)
        reply = engine.generate(prompt, "ar", config, prompt_ids).token_ids
        fix.sequence = prompt_ids + reply
        order = args.fix[slot % len(args.fix):] + args.fix[: slot % len(args.fix)]
        for q in order:
            speeds = {}
            for method in ("ar", args.method):
                fix.q, fix.right, fix.drafted = q, 0, 0
                start = time.perf_counter()
                trace = engine.generate(prompt, method, config, prompt_ids)
                speeds[method] = trace.new_tokens / (time.perf_counter() - start)
                same = same and trace.token_ids == reply
            ratios[(q, name)].append(speeds[args.method] / speeds["ar"])
            taus[q].append((trace.new_tokens - 1) / trace.cycles)
            right[q][0] += fix.right
            right[q][1] += fix.drafted
    sets = list(dict.fromkeys(name for name, _ in benchmark_prompts(args.prompts)))
    print(f"| q | best first token right | τ | " + " | ".join(sets) + " | mean over AR |")
    print("|---" * (len(sets) + 4) + "|")
    for q in args.fix:
        cells = [statistics.mean(ratios[(q, name)]) for name in sets]
        every = [r for name in sets for r in ratios[(q, name)]]
        print(f"| {q:.2f} | {right[q][0] / max(right[q][1], 1):.3f} | {statistics.mean(taus[q]):.2f} | " +
              " | ".join(f"{c:.2f}x" for c in cells) + f" | {statistics.mean(every):.2f}x |")
    print("every output equal to AR's:", same)


if __name__ == "__main__":
    main()
