"""Prompt lookup's branches in a learned drafter's tree (docs/design.md §17.5), on and off, in one process: each
variant sets the switch's threshold and the branches' shortest match on the automatic (sized) trees, or on the
methods' fixed CPU trees with `--fixed`; a trailing "-" turns the short matches' switch off (short_match.py, §17.4);
interleaved per prompt, so that the host's drift between runs cancels.

    PYTHONPATH=. .venv/bin/python scripts/branches_ab.py --variants 3:0 3:1 --prompts 6
    PYTHONPATH=. .venv/bin/python scripts/branches_ab.py --variants 3:0 3:1 --prompts 4 --fixed
    PYTHONPATH=. .venv/bin/python scripts/branches_ab.py --variants 3:0- 3:0 2:0- --prompts 8
"""

from __future__ import annotations

import argparse
from dataclasses import replace

from gumiho import engine as loop
from gumiho.loader import build_engine
from gumiho.tree import TreeSettings

from scripts.engine_ab import benchmark_prompts, interleave


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variants", nargs="+", default=["3:0", "3:1"],
                        help="SWITCH:BRANCHES[-], each a variant (lookup_merge and lookup_branches; 0 is off; a "
                             "trailing - turns the short matches' switch off)")
    parser.add_argument("--prompts", type=int, default=3, help="first prompts of each set")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--methods", nargs="+", default=["gumiho", "eagle2"])
    parser.add_argument("--fixed", action="store_true", help="the methods' fixed CPU trees, not the automatic ones")
    args = parser.parse_args()
    engine = build_engine(threads=2)
    base = {m: TreeSettings.default(m, "cpu") if args.fixed else engine.choice.methods[m].tree for m in args.methods}
    print("trees:", {m: (t.total_tokens, t.top_k, "sized" if t.sized else "fixed") for m, t in base.items()})

    short_matches = [True]  # whether the variant being run keeps the short matches' switch
    run_init = loop.Run.__init__

    def init(self, *args, **kwargs):
        run_init(self, *args, **kwargs)
        if not short_matches[0]:
            self.short_match = None

    loop.Run.__init__ = init

    def variant(spec: str):
        switch, branches = map(int, spec.rstrip("-").split(":"))
        chosen = {m: replace(t, lookup_merge=switch, lookup_branches=branches) for m, t in base.items()}

        def setup():
            short_matches[0] = not spec.endswith("-")
            for m, tree in chosen.items():
                engine.choice.methods[m].tree = tree
            return engine
        return setup

    interleave({spec: variant(spec) for spec in args.variants}, args.methods, benchmark_prompts(args.prompts),
               args.tokens)


if __name__ == "__main__":
    main()
