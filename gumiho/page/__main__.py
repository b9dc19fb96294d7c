"""python -m gumiho page TRACE.json [TRACE.json ...] --out DIR: a folder that replays recorded runs with no server
(index.html, page.js, plotly.min.js, and a README.md that makes it a Hugging Face Static Space)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from ..cli import OneLineParser, run_reporting_errors


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="python -m gumiho page", description=__doc__)
    parser.add_argument("traces", nargs="+", metavar="TRACE.json",
                        help="trace files (the app's downloads, or a line of generate --json --trace); a folder "
                             "stands for the .json files under it, and a pattern is also matched in subfolders")
    parser.add_argument("--out", required=True, help="folder to write (made if missing; our four files replaced)")
    return parser


def run(args: argparse.Namespace) -> int:
    from . import count, read_traces, trace_paths, write_page

    start = time.perf_counter()
    page = write_page(read_traces(trace_paths(args.traces)), Path(args.out))
    print(f"wrote {page.folder / 'index.html'}: {count(page.runs, 'run')} of {count(page.prompts, 'prompt')}, "
          f"{page.size / 1e6:.1f} MB with its assets, in {time.perf_counter() - start:.1f} s", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    return run_reporting_errors(lambda: run(args))


if __name__ == "__main__":
    sys.exit(main())
