"""Before and after in one process: draft heads' top-k log-probs through torch (division, log-softmax, NaN filter,
top-k) against the one-call kernel (kernels/rows.cpp `top_logprobs`), interleaved per prompt and method at the
automatic trees, so that the host's drift cancels (docs/benchmarks.md, "Where a cycle's time goes").

Decoding only (the prefill left out): tokens/s over our AR, the median draft ms of a cycle and the draft's share of
the cycles' time.

    bash scripts/campaign_hold.sh env PYTHONPATH=. .venv/bin/python scripts/topk_ab.py --prompts 2
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import gumiho.drafters.base as drafter_base
from gumiho.engine import GenerationConfig
from gumiho.loader import build_engine
from gumiho.prompts import read_prompt_file

BENCHMARKS = Path(__file__).resolve().parent.parent / "data" / "benchmarks"
VARIANTS = {"torch": 0, "one call": drafter_base.FUSED_TOP_K}  # the widest k the kernel takes (0: never)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sets", nargs="+", default=["mt_bench", "gsm8k", "humaneval"], help="data/benchmarks names")
    parser.add_argument("--prompts", type=int, default=2, help="first prompts of each set")
    parser.add_argument("--tokens", type=int, default=96, help="new tokens per answer")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    engine = build_engine(threads=2)
    prompts = [r.turns[0] for name in args.sets
               for r in read_prompt_file(BENCHMARKS / f"{name}.jsonl", limit=args.prompts)]
    runs = [("ar", "-")] + [(m, v) for m in ("gumiho", "eagle2") for v in ("torch", "one call")]
    seconds, tokens = dict.fromkeys(runs, 0.0), dict.fromkeys(runs, 0)
    draft: dict[tuple[str, str], list[float]] = {r: [] for r in runs}
    cycle_ms = dict.fromkeys(runs, 0.0)
    config = GenerationConfig(max_new_tokens=args.tokens, trace=False)
    for _ in range(args.rounds):
        for prompt in prompts:
            for method, variant in runs:
                if variant in VARIANTS:  # AR drafts nothing: its runs leave the switch as it is
                    drafter_base.FUSED_TOP_K = VARIANTS[variant]
                run = engine.run(prompt, method, config)
                start = time.perf_counter()
                cycles = list(run)  # the prefill runs at the first cycle's request: time from here on is decoding
                seconds[method, variant] += time.perf_counter() - start - run.trace.prefill_ms / 1e3
                tokens[method, variant] += sum(len(c.emitted) for c in cycles)
                draft[method, variant] += [c.draft_ms for c in cycles]
                cycle_ms[method, variant] += sum(c.draft_ms + c.verify_ms + c.other_ms for c in cycles)
    ar = tokens["ar", "-"] / seconds["ar", "-"]
    print("| method | top-k | tokens/s | over AR | draft ms (median) | draft share |\n|---|---|---|---|---|---|")
    for key in runs:
        rate = tokens[key] / seconds[key]
        print(f"| {key[0]} | {key[1]} | {rate:.1f} | {rate / ar:.3f}x | {statistics.median(draft[key]):.3f} | "
              f"{sum(draft[key]) / cycle_ms[key]:.1%} |")


if __name__ == "__main__":
    main()
