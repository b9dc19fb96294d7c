"""How the 4-bit and 8-bit products ask for their weights, side by side in one process: the fastest streaming
setting (non-temporal, or not at all) against keeping them in the caches (int4.KEEP), each measured at load as
`int4.fastest_fetch` measures them, the two interleaved per prompt so that the host's drift cancels
(docs/benchmarks.md, "Weights kept in a 320 MB L3").

    PYTHONPATH=. .venv/bin/python scripts/fetch_ab.py --prompts 2
"""

from __future__ import annotations

import argparse

from gumiho import int4
from gumiho.loader import build_engine

from scripts.engine_ab import benchmark_prompts, interleave


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=2, help="first prompts of each set")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--methods", nargs="+", default=["gumiho", "eagle2", "lookup"])
    args = parser.parse_args()
    engine = build_engine(threads=2)
    lean = engine.target.lean
    if lean is None or lean.int4 is None or lean.layers[0].o.kernel is None:
        raise SystemExit("error: the automatic path here is not the int4 path with our 4-bit kernel")
    _, medians = lean.fastest_fetch()
    print("a step's 4-bit products, median ms:", {f"{a}{'/keep' if k else ''}": round(ms, 2)
                                                  for (a, k), ms in medians.items()})
    settings = {name: min((f for f in medians if f[1] == keep), key=medians.get)
                for name, keep in (("stream", False), ("keep", True))}

    def use(setting: tuple[int, bool]):
        def setup():
            int4.AHEAD, int4.KEEP = setting
            return engine
        return setup

    print("settings:", settings)
    interleave({name: use(setting) for name, setting in settings.items()}, args.methods,
               benchmark_prompts(args.prompts), args.tokens)


if __name__ == "__main__":
    main()
