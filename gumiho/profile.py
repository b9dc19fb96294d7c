"""Engine self-check timings: `python -m gumiho.profile [--max-new-tokens N] [--rounds R]`.

Measures, side by side in one process with the methods interleaved:
  - the AR loop's tokens/s against `model.generate` (greedy, same prompt ids, same thread count);
  - the cost of tracing (Gumiho with trace on vs off);
  - the per-cycle time split (draft / verify / other) of EAGLE-2 and Gumiho at the default tree.
Wall-clock numbers on a shared machine are noisy: read the ratios.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch

from .engine import Engine, GenerationConfig
from .loader import build_engine

PROMPTS = [
    "Explain why the sky is blue to a ten-year-old.",
    "Write a short poem about a lighthouse keeper.",
    "Give me three tips for learning a new language.",
]


def generate_tokens_per_s(engine: Engine, ids: list[int], max_new_tokens: int) -> tuple[float, int]:
    model = engine.target.model
    inputs = torch.tensor([ids], device=engine.target.device)
    start = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(inputs, attention_mask=torch.ones_like(inputs), max_new_tokens=max_new_tokens,
                             do_sample=False, pad_token_id=engine.target.tokenizer.eos_token_id)
    new = out.shape[1] - inputs.shape[1]
    return new / (time.perf_counter() - start), new


def profile(engine: Engine, max_new_tokens: int, rounds: int) -> dict:
    ar_rates, gen_rates, traced, untraced = [], [], [], []
    split = {m: {"draft_ms": [], "verify_ms": [], "other_ms": [], "tau": []} for m in ("eagle2", "gumiho")}
    equal = True
    config = GenerationConfig(max_new_tokens=max_new_tokens)
    engine.generate(PROMPTS[0], "ar", GenerationConfig(max_new_tokens=8))  # warm-up
    for _ in range(rounds):
        for prompt in PROMPTS:
            ids = engine.target.encode_prompt(prompt)
            ar = engine.generate(prompt, "ar", config, prompt_ids=ids)
            rate, new = generate_tokens_per_s(engine, ids, max_new_tokens)
            ar_rates.append(ar.tokens_per_s)
            gen_rates.append(rate)
            for method in ("eagle2", "gumiho"):
                trace = engine.generate(prompt, method, config, prompt_ids=ids)
                equal &= trace.token_ids == ar.token_ids
                for key in ("draft_ms", "verify_ms", "other_ms"):
                    split[method][key].append(statistics.mean(getattr(s, key) for s in trace.steps))
                split[method]["tau"].append(trace.tau)
                if method == "gumiho":
                    off = engine.generate(prompt, method, GenerationConfig(max_new_tokens=max_new_tokens, trace=False),
                                          prompt_ids=ids)
                    traced.append(trace.wall_s / trace.cycles)
                    untraced.append(off.wall_s / off.cycles)
    mean = statistics.mean
    return {
        "threads": torch.get_num_threads(),
        "device": engine.target.device.type,
        "ar_tokens_per_s": mean(ar_rates),
        "generate_tokens_per_s": mean(gen_rates),
        "ar_over_generate": mean(a / g for a, g in zip(ar_rates, gen_rates)),
        "tracing_overhead": mean(t / u for t, u in zip(traced, untraced)) - 1,
        "greedy_equal_to_ar": equal,
        "cycle_split_ms": {m: {k: mean(v) for k, v in d.items()} for m, d in split.items()},
        "drafters": engine.drafter_names,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gumiho.profile", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    result = profile(build_engine(threads=args.threads), args.max_new_tokens, args.rounds)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
