"""A prompt's whole prefill under each way this machine has of computing its causal attention (llama.CausalAttention:
the block kernel's fp32 and bf16 products, SDPA's bf16, the kernel's bf16 on AMX tiles), or (`--vary weights`) under
each float weights a long prompt may take (fp32, bf16 through oneDNN, bf16 packed for AMX tiles where the machine has
them), in one process, the candidates taking turns on every prompt (docs/benchmarks.md, "A prompt's attention on AMX
tiles" and "A prompt's products on AMX tiles").

Each prefill is the target's features and its last row's logits from an empty cache, as a run starts
(`Engine`'s prefill: the prompt through `prompt_layers`, float weights from `prefill_from` tokens); means over the
rounds after the first, which builds and warms.

    PYTHONPATH=. .venv/bin/python scripts/prefill_ab.py --prompts 8 --sets sum
    PYTHONPATH=. .venv/bin/python scripts/prefill_ab.py --prompts 8 --sets sum --vary weights
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from functools import partial

import torch

from gumiho.llama import BF16_TILES, PREFILL_DTYPES, PROMPT_ATTENTIONS, LeanLlama
from gumiho.loader import build_engine
from gumiho.tiles import tiles_available

from scripts.engine_ab import SETS, benchmark_prompts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=8, help="first prompts of each set")
    parser.add_argument("--sets", nargs="+", default=["sum"], choices=SETS)
    parser.add_argument("--rounds", type=int, default=4, help="rounds over the prompts; the first is not counted")
    parser.add_argument("--vary", choices=["attention", "weights"], default="attention",
                        help="what the candidates differ in: the causal attention's way, or the float weights")
    args = parser.parse_args()
    engine = build_engine(threads=2)
    target, lean = engine.target, engine.target.lean
    if lean is None:
        parser.exit(2, "prefill_ab: the automatic path here has no lean forward\n")
    prompts = [torch.tensor(target.encode_prompt(text)) for _, text in benchmark_prompts(args.prompts, args.sets)]
    print(f"{len(prompts)} prompts of {statistics.mean(len(p) for p in prompts):.0f} tokens on average; prefill "
          f"weights {lean.prefill_dtype}{' on tiles' if lean.prefill_tiles else ''} from {lean.prefill_from} tokens, "
          f"attention {lean.prefill_attention.name}", flush=True)
    kept = lean.prefill_layers, lean.prefill_dtype, lean.prefill_tiles, lean.prefill_attention
    candidates = weights_candidates(lean, target.model) if args.vary == "weights" else attention_candidates(lean)
    times: dict[str, list[float]] = {name: [] for name in candidates}
    with torch.inference_mode():
        for round_ in range(args.rounds):
            for prompt in prompts:
                for name, setup in candidates.items():
                    setup()
                    start = time.perf_counter()
                    target.logits(target.features(prompt, target.new_cache(), prefill=True)[-1])
                    if round_:
                        times[name].append((time.perf_counter() - start) * 1e3)
    lean.prefill_layers, lean.prefill_dtype, lean.prefill_tiles, lean.prefill_attention = kept
    fastest = min(statistics.mean(taken) for taken in times.values())
    print(f"| {args.vary} | ms a prompt | x the fastest |\n|---|---|---|")
    for name, taken in times.items():
        print(f"| {name} | {statistics.mean(taken):.1f} | {statistics.mean(taken) / fastest:.2f} |")


def attention_candidates(lean: LeanLlama) -> dict[str, Callable[[], None]]:
    """One per way of computing the prompt's attention here (as the load's choice times them)."""
    ways = {lean._runs_as(attention): attention for attention in reversed(PROMPT_ATTENTIONS)}

    def setup(attention):
        return lambda: setattr(lean, "prefill_attention", attention)
    return {attention.name: setup(attention) for attention in ways.values()}


def weights_candidates(lean: LeanLlama, model) -> dict[str, Callable[[], None]]:
    """One per float weights a long prompt may take here, each a full set of layers built once."""
    candidates = {}
    for weights in PREFILL_DTYPES + ((BF16_TILES,) if tiles_available() else ()):
        layers = [lean._layer(f"model.layers.{i}", layer, partial(lean._float_for_prefill, weights))
                  for i, layer in enumerate(model.model.layers)]
        dtype = torch.bfloat16 if weights == BF16_TILES else weights

        def setup(layers=layers, dtype=dtype, tiles=weights == BF16_TILES):
            lean.prefill_layers, lean.prefill_dtype, lean.prefill_tiles = layers, dtype, tiles
        candidates[str(weights).removeprefix("torch.")] = setup  # BF16_TILES: "bfloat16-tiles"
    return candidates


if __name__ == "__main__":
    main()
