"""A learned drafter's prompt-lookup switch (`TreeSettings.lookup_merge` N: a cycle whose text's last N tokens
occurred before verifies prompt lookup's tree instead of drafting) at several N, side by side with prompt lookup
alone, interleaved per prompt with AR, every output checked equal to AR's (docs/benchmarks.md, "A drafter's prompt
window...").

    PYTHONPATH=. .venv/bin/python scripts/switch_ab.py --prompts 2 --merges 3 2 1
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import defaultdict
from dataclasses import replace

from gumiho.engine import GenerationConfig
from gumiho.loader import build_engine

from scripts.engine_ab import benchmark_prompts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=2, help="first prompts of each set")
    parser.add_argument("--merges", type=int, nargs="+", default=[3, 2, 1])
    parser.add_argument("--method", default="gumiho")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    engine = build_engine(threads=2)
    automatic = engine.tree_settings(args.method, GenerationConfig())  # sized per cycle, as a run takes it
    variants = {f"{args.method}, switch at {n}": (args.method, replace(automatic, lookup_merge=n)) for n in args.merges}
    variants["prompt lookup alone"] = ("lookup", None)
    prompts = benchmark_prompts(args.prompts)
    speed, tau = defaultdict(list), defaultdict(list)
    for round_ in range(args.rounds):
        for name, prompt in prompts:
            start = time.perf_counter()
            ar = engine.generate(prompt, "ar", GenerationConfig(max_new_tokens=128))
            ar_speed = ar.new_tokens / (time.perf_counter() - start)
            for variant in list(variants) if round_ % 2 == 0 else list(variants)[::-1]:
                method, tree = variants[variant]
                start = time.perf_counter()
                run = engine.generate(prompt, method, GenerationConfig(max_new_tokens=128, tree=tree))
                speed[variant, name].append(run.new_tokens / (time.perf_counter() - start) / ar_speed)
                tau[variant].append((run.new_tokens - 1) / run.cycles)
                assert run.token_ids == ar.token_ids, f"{variant}: not AR's output"
    sets = list(dict.fromkeys(name for name, _ in prompts))
    print("| variant | " + " | ".join(sets) + " | mean over AR | τ |\n" + "|---" * (len(sets) + 3) + "|")
    for variant in variants:
        cells = [statistics.mean(speed[variant, name]) for name in sets]
        print(f"| {variant} | " + " | ".join(f"{c:.3f}x" for c in cells)
              + f" | {statistics.mean(cells):.3f}x | {statistics.mean(tau[variant]):.2f} |")


if __name__ == "__main__":
    main()
