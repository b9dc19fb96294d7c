"""Re-record the example runs shipped in assets/traces/ with the current engine and drafters:

    python -m app.record_examples            # every example (races of every loaded method and AR per prompt)
    python -m app.record_examples --max-new-tokens 32 --rounds 1

The study-tips and haiku races run at this machine's automatic trees (a slow CPU picks small ones, down to a single
draft token), so the races the page opens with tell the speed story of the machine that recorded them. The
palindrome race, the lesson's showcase, verifies a fixed 12 tokens with FTA on, so that its trees have the depth
the lesson draws and FTA has short paths to pad, whatever the recording machine picks. Pause other work while
recording (bash scripts/campaign_hold.sh python -m app.record_examples): the races are timed. A race of 64 tokens
takes a quarter of a second per method, and one run's speed-up moved by a fifth between recordings (EAGLE-2 on study
tips 1.05x-1.27x AR on a 2-core Zen 5 EPYC), so each example is raced `--rounds` times and each method keeps its run
of median wall time: the same text every round (greedy), its typical speed.
"""

from __future__ import annotations

import argparse
import logging
import shutil
from dataclasses import dataclass

from gumiho.trace import GenerationTrace

from .examples import PROMPTS, TRACES
from .service import Control, RunSettings, load_default_engine, race, race_settings


@dataclass(frozen=True)
class Recording:
    name: str
    prompt: str
    fta: bool
    total_tokens: int | None = None  # tokens every method verifies per cycle; None: the automatic trees


RECORDINGS = [  # the app opens on the first one
    Recording("1-study-tips", PROMPTS[3], fta=False),
    Recording("2-palindrome-fta", PROMPTS[1], fta=True, total_tokens=12),
    Recording("3-haiku", PROMPTS[2], fta=False),
]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m app.record_examples", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3, help="races per example; each method keeps its median run")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1, not {args.rounds}")
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    engine = load_default_engine(lambda phase: logging.info("engine: %s", phase))
    shutil.rmtree(TRACES, ignore_errors=True)
    for recording in RECORDINGS:
        settings = RunSettings(max_new_tokens=args.max_new_tokens, fta=recording.fta,
                               total_tokens=recording.total_tokens)
        configs = {m: s.config(m, engine.default_tree(m)) for m, s in race_settings(settings, engine.drafters).items()}
        rounds = [list(race(engine, recording.prompt, configs, Control()))[-1] for _ in range(args.rounds)]
        traces = [median_run(list(runs)) for runs in zip(*rounds)]  # a race runs its methods in one order
        folder = TRACES / recording.name
        folder.mkdir(parents=True)
        for trace in traces:
            (folder / f"{trace.method}.json").write_text(trace.to_json(), encoding="utf-8")
            logging.info("%s/%s: %d tokens, tau %.2f, %.1f tokens/s", recording.name, trace.method,
                         trace.new_tokens, trace.tau, trace.tokens_per_s)
    return 0


def median_run(runs: list[GenerationTrace]) -> GenerationTrace:
    """Of one method's runs, the one of median wall time (the upper median of an even count)."""
    return sorted(runs, key=lambda trace: trace.wall_s)[len(runs) // 2]


if __name__ == "__main__":
    raise SystemExit(main())
