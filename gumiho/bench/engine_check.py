"""Engine self-check: `python -m gumiho.bench.engine_check [--max-new-tokens N] [--rounds R]`.

Two questions about the decoding loop itself, answered side by side in one process with the runs interleaved:
  - is the AR loop as fast as transformers' `model.generate` (greedy, same prompt ids, same thread count)?
  - what does tracing cost (Gumiho with the trace on vs off, time per cycle)?
The per-cycle draft / verify split lives in the bench's profile (`gumiho.bench.breakdown`).
Wall-clock numbers on a shared machine are noisy: read the ratios.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

import torch

from ..engine import Engine, GenerationConfig
from ..target import DEFAULT_MODEL

PROMPTS = (
    "Explain why the sky is blue to a ten-year-old.",
    "Write a short poem about a lighthouse keeper.",
    "Give me three tips for learning a new language.",
)


def check(engine: Engine, max_new_tokens: int, rounds: int, prompts: tuple[str, ...] = PROMPTS,
          method: str = "gumiho", model: str | None = DEFAULT_MODEL) -> dict:
    """Ratios per prompt, then averaged: AR loop over `model.generate`, traced over untraced cycle time - 1."""
    from .reference import TransformersReference, baseline_dtype

    reference = TransformersReference(engine.target, model)
    dtype = baseline_dtype(engine.target)
    ar_over_generate, overhead, ar_rates = [], [], []
    traced = GenerationConfig(max_new_tokens=max_new_tokens)
    untraced = GenerationConfig(max_new_tokens=max_new_tokens, trace=False)
    engine.generate(prompts[0], "ar", GenerationConfig(max_new_tokens=8))  # warm-up
    for _ in range(rounds):
        for prompt in prompts:
            ids = engine.target.encode_prompt(prompt)
            ar = engine.generate(prompt, "ar", traced, prompt_ids=ids)
            ar_rates.append(ar.tokens_per_s)
            plain = reference.generate(dtype, prompt, ids, max_new_tokens, 0.0, 0)
            ar_over_generate.append(ar.tokens_per_s / plain.tokens_per_s)
            on = engine.generate(prompt, method, traced, prompt_ids=ids)
            off = engine.generate(prompt, method, untraced, prompt_ids=ids)
            overhead.append((on.wall_s / on.cycles) / (off.wall_s / off.cycles) - 1)
    return {
        "device": engine.target.device.type,
        "threads": torch.get_num_threads(),
        "runs": len(ar_rates),
        "max_new_tokens": max_new_tokens,
        "ar_tokens_per_s": statistics.mean(ar_rates),
        "ar_over_generate": statistics.mean(ar_over_generate),
        "tracing_overhead": statistics.mean(overhead),
        "tracing_overhead_median": statistics.median(overhead),
        "traced_method": method,
    }


def main(argv: list[str] | None = None) -> int:
    from ..cli import OneLineParser, quiet_libraries
    from ..loader import build_engine

    parser = OneLineParser(prog="python -m gumiho.bench.engine_check", description=__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, help="torch threads (default: all cores)")
    args = parser.parse_args(argv)
    quiet_libraries()
    print(json.dumps(check(build_engine(threads=args.threads), args.max_new_tokens, args.rounds), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
