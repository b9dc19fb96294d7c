"""Where a method loses to AR on text it cannot guess: the method as it is, with its drafts made but never
verified, and with plain steps only (no draft at all), against AR, interleaved in one process; decoding time only
(the prefill left out), and the median verification of the plain cycles (docs/benchmarks.md, "First-level trees").

    PYTHONPATH=. .venv/bin/python scripts/plain_modes.py --method recycle --first 3 --prompts 8
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import defaultdict
from contextlib import ExitStack
from unittest import mock

from gumiho.engine import GenerationConfig
from gumiho.loader import build_engine
from gumiho.prompts import read_prompt_file
from gumiho.sizing import Sizer

from app.examples import PROMPTS
from scripts.engine_ab import ROOT

ONE_ROW = {"choose": lambda self, *args, **kwargs: (1, 0.0)}  # the sizer verifies nothing but the root
MODES = {"as it is": {}, "drafts never verified": ONE_ROW,
         "plain steps only": {**ONE_ROW, "could_pay": lambda self, *args, **kwargs: False}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--method", default="recycle")
    parser.add_argument("--first", type=int, default=3, help="MT-Bench prompts skipped")
    parser.add_argument("--prompts", type=int, default=8, help="MT-Bench prompts read (the first --first skipped)")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    engine = build_engine(threads=2)
    records = read_prompt_file(ROOT / "data" / "benchmarks" / "mt_bench.jsonl", limit=args.prompts)
    prompts = [r.turns[0] for r in records][args.first:] + [PROMPTS[0], PROMPTS[3]]
    runs = {"AR": ("ar", {}), **{f"{args.method} {mode}": (args.method, patches) for mode, patches in MODES.items()}}
    decode_ms, tokens, plain = defaultdict(float), defaultdict(int), defaultdict(list)
    for _ in range(args.rounds):
        for prompt in prompts:
            for name, (method, patches) in runs.items():
                with ExitStack() as stack:
                    for attribute, replacement in patches.items():
                        stack.enter_context(mock.patch.object(Sizer, attribute, replacement))
                    start = time.perf_counter()
                    trace = engine.generate(prompt, method, GenerationConfig(max_new_tokens=128))
                    decode_ms[name] += (time.perf_counter() - start) * 1e3 - trace.prefill_ms
                tokens[name] += trace.new_tokens
                plain[name] += [s.verify_ms for s in trace.steps if s.tree_size == 1]
    ar = decode_ms["AR"] / tokens["AR"]
    print("| mode | decoding ms a token | over AR | plain cycles' verification, median |\n|---|---|---|---|")
    for name in runs:
        per_token = decode_ms[name] / tokens[name]
        print(f"| {name} | {per_token:.3f} | {ar / per_token:.3f}x | {statistics.median(plain[name]):.3f} ms |")


if __name__ == "__main__":
    main()
