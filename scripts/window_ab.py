"""A feature drafter's prompt window side by side: Gumiho (or EAGLE-2) reading a prompt's last W pairs for several W
(`drafters.base.PROMPT_WINDOW`; 0: the whole prompt), interleaved per prompt with AR, every output checked equal to
AR's (docs/benchmarks.md, "A drafter's prompt window...").

    PYTHONPATH=. .venv/bin/python scripts/window_ab.py --sets sum --prompts 4
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import defaultdict

from gumiho.drafters import base
from gumiho.engine import GenerationConfig
from gumiho.loader import build_engine

from scripts.engine_ab import benchmark_prompts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sets", nargs="+", default=["sum"], help="data/benchmarks names")
    parser.add_argument("--prompts", type=int, default=4, help="first prompts of each set")
    parser.add_argument("--windows", type=int, nargs="+", default=[0, 512, 256, 128, 64])
    parser.add_argument("--method", default="gumiho")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    engine = build_engine(threads=2)
    config = GenerationConfig(max_new_tokens=128)
    prompts = [(name, prompt) for name, prompt in benchmark_prompts(args.prompts) if name in args.sets]
    speed, tau = defaultdict(list), defaultdict(list)
    for round_ in range(args.rounds):
        for _, prompt in prompts:
            start = time.perf_counter()
            ar = engine.generate(prompt, "ar", config)
            ar_speed = ar.new_tokens / (time.perf_counter() - start)
            for window in args.windows if round_ % 2 == 0 else args.windows[::-1]:
                base.PROMPT_WINDOW = window or engine.target.max_context
                start = time.perf_counter()
                run = engine.generate(prompt, args.method, config)
                speed[window].append(run.new_tokens / (time.perf_counter() - start) / ar_speed)
                tau[window].append((run.new_tokens - 1) / run.cycles)
                assert run.token_ids == ar.token_ids, f"window {window}: not AR's output"
    print("| window | speed over AR | τ |\n|---|---|---|")
    for window in args.windows:
        label = window or "whole prompt"
        print(f"| {label} | {statistics.mean(speed[window]):.3f}x | {statistics.mean(tau[window]):.3f} |")


if __name__ == "__main__":
    main()
