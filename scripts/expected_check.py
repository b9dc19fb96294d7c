"""The status line's expected speed-ups against the decoding time they predict: each method at its automatic
settings on the machine profile's own calibration prompts (the texts its expectation replays prompt lookup on),
decoding only (wall time less prefill), interleaved per prompt (docs/design.md §15, "Expected speed-ups").

    PYTHONPATH=. .venv/bin/python scripts/expected_check.py --rounds 2
"""

from __future__ import annotations

import argparse
from collections import Counter

from gumiho.engine import GenerationConfig
from gumiho.loader import build_engine
from gumiho.profile import TEXT_PROMPT_TOKENS, TEXT_PROMPTS, TEXT_TOKENS, calibration_prompts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--methods", nargs="+", default=["eagle2", "gumiho", "eagle1", "lookup", "recycle"])
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    engine = build_engine(threads=2)
    methods = ["ar", *args.methods]
    prompts = [p for p in calibration_prompts()
               if len(engine.target.encode_prompt(p)) <= TEXT_PROMPT_TOKENS][:TEXT_PROMPTS]
    config = GenerationConfig(max_new_tokens=TEXT_TOKENS, trace=False)
    decoding_ms, tokens = Counter(), Counter()
    for _ in range(args.rounds):
        for prompt in prompts:
            for method in methods:
                trace = engine.generate(prompt, method, config)
                decoding_ms[method] += trace.wall_s * 1e3 - trace.prefill_ms
                tokens[method] += trace.new_tokens - 1
    ar = decoding_ms["ar"] / tokens["ar"]
    print("| method | expected | measured, decoding | status line |\n|---|---|---|---|")
    for method in args.methods:
        print(f"| {method} | {engine.choice.methods[method].speedup:.2f}x | "
              f"{ar / (decoding_ms[method] / tokens[method]):.2f}x | {engine.choice.summary(method)} |")


if __name__ == "__main__":
    main()
