"""Where a cycle's time goes, from the engine's own per-cycle timings: tokens/s, τ, median verify and draft ms,
and how many cycles verified each tree size, per method at its automatic settings (docs/benchmarks.md).

    PYTHONPATH=. .venv/bin/python scripts/cycle_costs.py --sets mt_bench gsm8k sum --prompts 2 --tokens 96
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import Counter
from pathlib import Path

from gumiho.engine import GenerationConfig
from gumiho.loader import build_engine
from gumiho.prompts import read_prompt_file

BENCHMARKS = Path(__file__).resolve().parent.parent / "data" / "benchmarks"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--methods", nargs="+", default=["ar", "gumiho", "eagle2"])
    parser.add_argument("--sets", nargs="+", default=["mt_bench", "gsm8k", "sum"], help="data/benchmarks names")
    parser.add_argument("--prompts", type=int, default=2, help="first prompts of each set")
    parser.add_argument("--tokens", type=int, default=96, help="new tokens per answer")
    parser.add_argument("--rounds", type=int, default=2, help="rounds, methods interleaved per prompt")
    args = parser.parse_args()
    engine = build_engine(threads=2)
    prompts = [r.turns[0] for name in args.sets
               for r in read_prompt_file(BENCHMARKS / f"{name}.jsonl", limit=args.prompts)]
    traces: dict[str, list] = {m: [] for m in args.methods}
    seconds = Counter()
    for _ in range(args.rounds):
        for prompt in prompts:
            for method in args.methods:
                start = time.perf_counter()
                traces[method].append(engine.generate(prompt, method, GenerationConfig(max_new_tokens=args.tokens)))
                seconds[method] += time.perf_counter() - start
    print("| method | tokens/s | τ | verify ms | draft ms | trees verified (n: cycles) |\n|---|---|---|---|---|---|")
    for method, runs in traces.items():
        steps = [s for t in runs for s in t.steps]
        tokens, cycles = sum(t.new_tokens for t in runs), sum(t.cycles for t in runs)
        sizes = Counter(s.tree_size for s in steps)
        verify, draft = (statistics.median(getattr(s, f) for s in steps) for f in ("verify_ms", "draft_ms"))
        print(f"| {method} | {tokens / seconds[method]:.1f} | {(tokens - len(runs)) / cycles:.2f} | {verify:.1f} | "
              f"{draft:.1f} | {', '.join(f'{n}: {c:,}' for n, c in sorted(sizes.items()))} |")


if __name__ == "__main__":
    main()
