"""The automatic trees against other tree sizes, in one process: the same engine, each drafter's tree set per
variant (per-cycle sizing on, as in the automatic choice), interleaved per prompt, so that the host's drift between
runs cancels (docs/benchmarks.md, "A CPU with bf16 units").

    PYTHONPATH=. .venv/bin/python scripts/tree_ab.py --trees 2:4 3:2 --prompts 3

A trailing f makes the tree a first-level one (the root's candidates only, design.md §11): --trees 2:2 3:2f. A
trailing @R computes every row of a tree of R rows or fewer in the root's head product (`verify.ALL_ROWS`, 3 by
default): --trees 3:2f 4:2@4 4:2.
"""

from __future__ import annotations

import argparse
import re
from dataclasses import replace

from gumiho import sizing, verify
from gumiho.loader import build_engine
from gumiho.profile import widest_tree

from scripts.engine_ab import benchmark_prompts, interleave


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trees", nargs="+", default=["2:4", "3:2"], help="TOKENS:TOP_K[f][@ROWS], each a variant")
    parser.add_argument("--prompts", type=int, default=3, help="first prompts of each set")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--methods", nargs="+", default=["gumiho", "eagle2"])
    args = parser.parse_args()
    specs = {spec: re.fullmatch(r"(\d+):(\d+)(f?)(?:@(\d+))?", spec) for spec in args.trees}
    if bad := [spec for spec, match in specs.items() if match is None]:
        parser.error(f"--trees takes TOKENS:TOP_K[f][@ROWS], not {bad[0]!r}")
    engine = build_engine(threads=2)
    automatic = {m: engine.choice.methods[m].tree for m in args.methods}
    print("automatic:", {m: (t.total_tokens, t.top_k) for m, t in automatic.items()})
    all_rows = verify.ALL_ROWS

    def trees(match: re.Match):
        n, k, rows = int(match[1]), int(match[2]), int(match[4] or all_rows)
        chosen = {m: replace(widest_tree(m, k), total_tokens=n, fta=t.fta, lookup_merge=t.lookup_merge, sized=True,
                             first_level=bool(match[3]))
                  for m, t in automatic.items()}

        def setup():
            verify.ALL_ROWS = sizing.ALL_ROWS = rows  # the walk's and the sizer's, read at each cycle
            for m, tree in chosen.items():
                engine.choice.methods[m].tree = tree
            return engine
        return setup

    interleave({f"{spec} (tokens:top_k)": trees(match) for spec, match in specs.items()}, args.methods,
               benchmark_prompts(args.prompts), args.tokens)


if __name__ == "__main__":
    main()
