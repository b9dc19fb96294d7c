"""The per-cycle sizing's fit: the accepted draft tokens it expected against those the target accepted, per method
and per bin of what it expected, over the first prompts of each benchmark set (docs/benchmarks.md).

    PYTHONPATH=. .venv/bin/python scripts/sizer_fit.py --prompts 2
"""

from __future__ import annotations

import argparse
from collections import defaultdict

from gumiho.engine import GenerationConfig
from gumiho.loader import build_engine

from scripts.engine_ab import benchmark_prompts

BINS = (0.0, 0.25, 0.5, 1.0, 2.0, float("inf"))  # expected accepted draft tokens per cycle


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=2, help="first prompts of each set")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--methods", nargs="+", default=["gumiho", "eagle2", "lookup", "recycle"])
    args = parser.parse_args()
    engine = build_engine(threads=2)
    config = GenerationConfig(max_new_tokens=args.tokens, trace=True)
    cells: dict[tuple[str, int], list[tuple[float, int]]] = defaultdict(list)
    for _, prompt in benchmark_prompts(args.prompts):
        for method in args.methods:
            for cycle in engine.generate(prompt, method, config).steps:
                if cycle.expected_accepted is not None and cycle.tree_size > 1:
                    b = next(i for i, top in enumerate(BINS[1:]) if cycle.expected_accepted < top)
                    cells[method, b].append((cycle.expected_accepted, len(cycle.accepted_tokens)))
    print("| method | expected accepted per cycle | cycles | expected (mean) | accepted (mean) |\n|---|---|---|---|---|")
    for method in args.methods:
        rows = [(b, cells[method, b]) for b in range(len(BINS) - 1) if cells[method, b]]
        for b, pairs in rows + [(None, [p for _, ps in rows for p in ps])]:
            label = "all" if b is None else f"{BINS[b]:g}-{BINS[b + 1]:g}"
            mean = lambda i: sum(p[i] for p in pairs) / len(pairs)  # noqa: E731
            print(f"| {method} | {label} | {len(pairs)} | {mean(0):.3f} | {mean(1):.3f} |")


if __name__ == "__main__":
    main()
