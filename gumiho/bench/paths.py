"""What each execution path costs in output quality, and what it gains in speed: greedy AR on every path the
machine profile considers, against fp32 AR on the same prompts.

    python -m gumiho.bench.paths --limit 2              # 2 prompts of each benchmark set, 128 new tokens

Per path: tokens_per_s (paths interleaved per prompt, so drift hits them alike) and vs_first; same_as_first, the
share of prompts whose output equals the first path's (fp32's) token for token; first_kept, the mean fraction of
fp32's tokens reproduced before the first difference; perplexity, the output's under the fp32 target (fp32 AR's
own is the floor). Writes the table as markdown (`<name>.md`; the app's Benchmarks tab reads the bench's runs, not
this).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from ..engine import Engine, GenerationConfig
from ..perplexity import perplexity
from ..profile import ExecPath, candidate_paths, target_for
from ..target import Target
from .datasets import DATASETS, DEFAULT_DIR, encode_conversation, load_questions


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def compare_paths(base: Target, paths: list[ExecPath], prompts: list[list[int]], max_new_tokens: int) -> pd.DataFrame:
    """One row per path: tokens/s, agreement with the first path's output (fp32 on a CPU) and perplexity under
    `base`. The first path is the reference."""
    engines = [Engine(target_for(base, path)) for path in paths]
    config = GenerationConfig(max_new_tokens=max_new_tokens, trace=False)
    engines[0].generate("", "ar", GenerationConfig(max_new_tokens=4), prompt_ids=prompts[0])  # warm-up
    rows = {path.label: {"tokens": 0, "seconds": 0.0, "equal": 0, "prefix": 0.0, "ppl": 0.0} for path in paths}
    for ids in prompts:
        outputs = []
        for path, engine in zip(paths, engines):
            run = engine.generate("", "ar", config, prompt_ids=ids)
            outputs.append(run.token_ids)
            row = rows[path.label]
            row["tokens"] += run.new_tokens
            row["seconds"] += run.wall_s
        reference = outputs[0]
        for path, output in zip(paths, outputs):
            row = rows[path.label]
            row["equal"] += output == reference
            row["prefix"] += common_prefix(output, reference) / max(len(reference), 1)
            row["ppl"] += perplexity(base, ids, output)
    n = len(prompts)
    first = rows[paths[0].label]["tokens"] / rows[paths[0].label]["seconds"]
    return pd.DataFrame([{"path": label, "tokens_per_s": r["tokens"] / r["seconds"],
                          "vs_first": (r["tokens"] / r["seconds"]) / first, "same_as_first": r["equal"] / n,
                          "first_kept": r["prefix"] / n, "perplexity": r["ppl"] / n} for label, r in rows.items()])


def main(argv: list[str] | None = None) -> int:
    from ..cli import positive, quiet_libraries, run_reporting_errors
    from ..target import load_target
    from .machine import describe
    from .report import md

    parser = argparse.ArgumentParser(prog="python -m gumiho.bench.paths", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--limit", type=positive, default=2, help="prompts per benchmark set (default 2)")
    parser.add_argument("--max-new-tokens", type=positive, default=128)
    parser.add_argument("--threads", type=positive)
    parser.add_argument("--out", default="assets/bench", help="folder for <name>.md")
    parser.add_argument("--name", default="paths")
    args = parser.parse_args(argv)
    quiet_libraries()

    def run() -> int:
        base = load_target(threads=args.threads)
        paths = candidate_paths(base.device, base.forward)
        prompts = [encode_conversation(base.tokenizer, q.turns[:1])
                   for name in DATASETS for q in load_questions(name, DEFAULT_DIR, args.limit)]
        table = compare_paths(base, paths, prompts, args.max_new_tokens)
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        machine = describe(base.device, base.dtype, False, base.forward)["description"]
        command = "python -m gumiho.bench.paths " + " ".join(argv if argv is not None else sys.argv[1:])
        text = (f"# Every execution path: speed and what it costs in output\n\n`{command}`: greedy AR on each path, "
                f"{len(prompts)} prompts ({args.limit} of each benchmark set), {args.max_new_tokens} new tokens, "
                f"paths interleaved per prompt. Machine: {machine}.\n\n"
                + md(table.map(lambda v: f"{v:.3g}" if isinstance(v, float) else v)) + "\n")
        (out / f"{args.name}.md").write_text(text)
        print(text)
        return 0

    return run_reporting_errors(run)


if __name__ == "__main__":
    sys.exit(main())
