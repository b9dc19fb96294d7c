"""Before and after in one process: the int4 path with an fp16 lm_head read row by row and the attention kernel of
an earlier commit, against the engine as it is (8-bit head read a likely path at a time), interleaved per prompt,
so that the host's drift between runs cancels (docs/benchmarks.md, "An 8-bit lm_head read a path at a time").

    PYTHONPATH=. .venv/bin/python scripts/engine_ab.py --prompts 3 --previous f562051
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import torch
from torch.utils.cpp_extension import load

from gumiho.engine import Engine, GenerationConfig
from gumiho.int4 import CastMatrix
from gumiho.loader import build_engine
from gumiho.prompts import read_prompt_file

ROOT = Path(__file__).resolve().parent.parent
SETS = ["mt_bench", "humaneval", "gsm8k", "alpaca", "sum", "qa"]


def previous_attention(commit: str, folder: Path):
    source = folder / "attention.cpp"
    source.write_text(subprocess.check_output(["git", "show", f"{commit}:gumiho/kernels/attention.cpp"], cwd=ROOT,
                                              text=True))
    return load(name=f"previous_attention_{commit}", sources=[str(source)], extra_cflags=["-O3", "-mavx2", "-mfma"],
                build_directory=str(folder))


def one_row_ms(head, width: int) -> float:
    x, times = torch.randn(1, width), []
    for _ in range(30):
        start = time.perf_counter()
        head(x).argmax(-1).tolist()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 4] * 1e3


def benchmark_prompts(count: int, sets: list[str] = SETS) -> list[tuple[str, str]]:
    """(set name, first turn) of the first `count` prompts of each of `sets`."""
    return [(name, r.turns[0]) for name in sets
            for r in read_prompt_file(ROOT / "data" / "benchmarks" / f"{name}.jsonl", limit=count)]


def interleave(variants: dict[str, Callable[[], Engine]], methods: list[str], prompts: list[tuple[str, str]],
               tokens: int) -> None:
    """For each prompt, every variant (its callable sets it up and returns the engine to run), AR and each method;
    prints each method's speed over its own variant's AR per set, tokens/s and tau, as a markdown table."""
    config = GenerationConfig(max_new_tokens=tokens)
    methods = ["ar", *[m for m in methods if m != "ar"]]
    runs, outputs = defaultdict(list), {}
    for name, prompt in prompts:
        for variant, setup in variants.items():
            engine = setup()
            for method in methods:
                start = time.perf_counter()
                trace = engine.generate(prompt, method, config)
                speed = trace.new_tokens / (time.perf_counter() - start)
                runs[(variant, method, name)].append((speed, (trace.new_tokens - 1) / trace.cycles))
                outputs[(variant, method, prompt)] = trace.token_ids
    sets = list(dict.fromkeys(name for name, _ in prompts))
    print("| variant | method | " + " | ".join(sets) + " | mean over AR | tokens/s | τ |")
    print("|---" * (len(sets) + 5) + "|")
    for variant in variants:
        for method in methods:
            cells, ratios, speeds, taus = [], [], [], []
            for name in sets:
                ar = [speed for speed, _ in runs[(variant, "ar", name)]]
                mine = runs[(variant, method, name)]
                ratio = [speed / base for (speed, _), base in zip(mine, ar)]
                ratios += ratio
                speeds += [speed for speed, _ in mine]
                taus += [tau for _, tau in mine]
                cells.append(f"{statistics.mean(ratio):.2f}x")
            print(f"| {variant} | {method} | " + " | ".join(cells) +
                  f" | {statistics.mean(ratios):.2f}x | {statistics.mean(speeds):.1f} | {statistics.mean(taus):.2f} |")
    same = all(outputs[(v, m, p)] == outputs[(v, "ar", p)] for v in variants for m in methods for _, p in prompts)
    print("every output equal to its variant's AR:", same)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=3, help="first prompts of each set")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--previous", default="f562051", help="the commit whose attention kernel is 'previous'")
    parser.add_argument("--methods", nargs="+", default=["lookup", "gumiho", "eagle2"])
    args = parser.parse_args()
    engine = build_engine(threads=2)
    target, lean, cost = engine.target, engine.target._lean, engine.choice.cost
    fp16 = CastMatrix(target.head_weight, torch.float16)

    def kernels(head, attention, head_ms) -> Callable[[], Engine]:
        def setup() -> Engine:
            target._head, lean.row_attention, cost.head_ms = head, attention, head_ms
            return engine
        return setup

    with tempfile.TemporaryDirectory() as folder:
        variants = {"previous": kernels(fp16, previous_attention(args.previous, Path(folder)),
                                        one_row_ms(fp16, target.head_weight.shape[1])),
                    "this": kernels(target._head, lean.row_attention, cost.head_ms)}
        interleave(variants, args.methods, benchmark_prompts(args.prompts), args.tokens)


if __name__ == "__main__":
    main()
