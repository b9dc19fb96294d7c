"""A prompt's whole prefill under each way this machine has of computing its causal attention (llama.CausalAttention:
the block kernel's fp32 and bf16 products, SDPA's bf16, the kernel's bf16 on AMX tiles), in one process, the ways
taking turns on every prompt (docs/benchmarks.md, "A prompt's attention on AMX tiles").

Each prefill is the target's features and its last row's logits from an empty cache, as a run starts
(`Engine`'s prefill: the prompt through `prompt_layers`, float weights from `prefill_from` tokens); means over the
rounds after the first, which builds and warms.

    PYTHONPATH=. .venv/bin/python scripts/prefill_ab.py --prompts 8 --sets sum
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from gumiho.llama import PROMPT_ATTENTIONS
from gumiho.loader import build_engine

from scripts.engine_ab import SETS, benchmark_prompts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=8, help="first prompts of each set")
    parser.add_argument("--sets", nargs="+", default=["sum"], choices=SETS)
    parser.add_argument("--rounds", type=int, default=4, help="rounds over the prompts; the first is not counted")
    args = parser.parse_args()
    engine = build_engine(threads=2)
    target, lean = engine.target, engine.target.lean
    if lean is None:
        parser.exit(2, "prefill_ab: the automatic path here has no lean forward\n")
    chosen = lean.prefill_attention
    # one name per way of computing it here (as the load's choice times them)
    ways = {lean._runs_as(attention): attention for attention in reversed(PROMPT_ATTENTIONS)}
    prompts = [torch.tensor(target.encode_prompt(text)) for _, text in benchmark_prompts(args.prompts, args.sets)]
    print(f"{len(prompts)} prompts of {statistics.mean(len(p) for p in prompts):.0f} tokens on average; prefill "
          f"weights {lean.prefill_dtype} from {lean.prefill_from} tokens; the load chose {chosen.name}", flush=True)
    times: dict[str, list[float]] = {attention.name: [] for attention in ways.values()}
    with torch.inference_mode():
        for round_ in range(args.rounds):
            for prompt in prompts:
                for attention in ways.values():
                    lean.prefill_attention = attention
                    start = time.perf_counter()
                    target.logits(target.features(prompt, target.new_cache(), prefill=True)[-1])
                    if round_:
                        times[attention.name].append((time.perf_counter() - start) * 1e3)
    lean.prefill_attention = chosen
    fastest = min(statistics.mean(taken) for taken in times.values())
    print("| causal attention | ms a prompt | x the fastest |\n|---|---|---|")
    for name, taken in times.items():
        print(f"| {name} | {statistics.mean(taken):.1f} | {statistics.mean(taken) / fastest:.2f} |")


if __name__ == "__main__":
    main()
