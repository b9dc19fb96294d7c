"""Decode steps and trees on AMX tiles against the fp32 attention, in one process: two engines, each with the machine
profile measured for its own attention (the load's remembered choice and the cached profile set aside, nothing
written), AR and each method interleaved per prompt, so that the host's drift between runs cancels
(docs/benchmarks.md, "Decode steps and trees on AMX tiles").

    PYTHONPATH=. .venv/bin/python scripts/rows_ab.py --prompts 8 --sets sum humaneval
"""

from __future__ import annotations

import argparse
from unittest import mock

from gumiho import profile
from gumiho.engine import Engine
from gumiho.kernels import row_attention
from gumiho.llama import LeanLlama
from gumiho.loader import build_engine

from scripts.engine_ab import SETS, benchmark_prompts, interleave


def engine_with(amx: bool) -> Engine:
    """An engine whose int4 path takes the AMX tiles (or not), its profile measured for that and not stored."""
    with mock.patch.object(LeanLlama, "_row_attention_choice", lambda self, file: amx), \
            mock.patch.object(profile, "_read_store", lambda target, drafters: (None, {})), \
            mock.patch.object(profile, "_store", lambda target, measured, store: None):
        engine = build_engine(threads=2)
    print(engine.target.attention, "|", engine.choice.summary("gumiho"), flush=True)
    return engine


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=3, help="first prompts of each set")
    parser.add_argument("--sets", nargs="+", default=SETS, choices=SETS)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--methods", nargs="+", default=["eagle2", "gumiho", "lookup"])
    args = parser.parse_args()
    kernel = row_attention()
    if kernel is None or not kernel.amx():
        parser.exit(2, "rows_ab: no AMX tiles here (the processor, the attention kernel's build or the OS)\n")
    engines = {"fp32 attention": engine_with(False), "AMX tiles": engine_with(True)}
    interleave({name: (lambda engine=engine: engine) for name, engine in engines.items()}, args.methods,
               benchmark_prompts(args.prompts, args.sets), args.tokens)


if __name__ == "__main__":
    main()
