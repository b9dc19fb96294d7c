"""This tree against an earlier commit, like for like: each side in its own process (its own code; the earlier one
with its own cache folder, ~/.cache/gumiho/ab/<commit>, and so its own machine profile and kernels), the sides
alternated round by round, so that the host's drift between runs hits both (docs/benchmarks.md, "A prompt's
attention in blocks...").

    PYTHONPATH=. .venv/bin/python scripts/commit_ab.py --before ca5ac60 --prompts 3 --rounds 3

Each round runs, per side, the first `--prompts` prompts of every benchmark set through AR and each method
(128 new tokens, greedy, no transformers rows) and prints tokens/s and the mean per-prompt ratio over AR.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SETS = ["mt_bench", "humaneval", "gsm8k", "alpaca", "sum", "qa"]


def one_side(prompts: int, methods: list[str], out: Path) -> None:
    """Run in a side's own process (its code on PYTHONPATH): AR and `methods` on each prompt, results to `out`."""
    from gumiho.engine import GenerationConfig
    from gumiho.loader import build_engine
    from gumiho.prompts import read_prompt_file

    engine = build_engine(threads=2)
    config = GenerationConfig(max_new_tokens=128, trace=False)
    speeds = defaultdict(list)
    for name in SETS:
        for record in read_prompt_file(ROOT / "data" / "benchmarks" / f"{name}.jsonl", limit=prompts):
            for method in ["ar", *methods]:
                start = time.perf_counter()
                trace = engine.generate(record.turns[0], method, config)
                speeds[method].append(trace.new_tokens / (time.perf_counter() - start))
    out.write_text(json.dumps(speeds))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", help="the earlier commit")
    parser.add_argument("--prompts", type=int, default=3, help="first prompts of each set")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--methods", nargs="+", default=["gumiho", "eagle2", "lookup", "recycle"])
    parser.add_argument("--side", help=argparse.SUPPRESS)  # internal: run one side and write its results there
    args = parser.parse_args()
    if args.side:
        return one_side(args.prompts, args.methods, Path(args.side))
    if not args.before:
        parser.error("--before is required")
    with tempfile.TemporaryDirectory() as folder:
        work = Path(folder)
        subprocess.run(["git", "worktree", "add", "-q", "--detach", str(work / "before"), args.before], cwd=ROOT,
                       check=True)
        try:
            from gumiho.target import cache_root

            sides = {"before": work / "before", "now": ROOT}
            caches = {"before": {"GUMIHO_CACHE": str(cache_root() / "ab" / args.before)}, "now": {}}
            runs = defaultdict(list)
            for r in range(args.rounds + 1):  # round 0 builds each side's kernels and profile, and is not kept
                for side, code in sides.items():
                    out = work / f"{side}-{r}.json"
                    env = {**os.environ, "PYTHONPATH": str(code), **caches[side]}
                    subprocess.run([sys.executable, __file__, "--side", str(out), "--prompts",
                                    str(args.prompts if r else 1), "--methods", *args.methods], env=env, check=True)
                    if r:
                        runs[side].append(json.loads(out.read_text()))
            print("| side | " + " | ".join(["ar", *args.methods]) + " |")
            print("|---" * (len(args.methods) + 2) + "|")
            for side, results in runs.items():
                cells = []
                for method in ["ar", *args.methods]:
                    speed = statistics.mean(s for run in results for s in run[method])
                    ratio = statistics.mean(s / a for run in results for s, a in zip(run[method], run["ar"]))
                    cells.append(f"{speed:.1f} tokens/s, {ratio:.3f}x")
                print(f"| {side} | " + " | ".join(cells) + " |")
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(work / "before")], cwd=ROOT, check=False)


if __name__ == "__main__":
    main()
