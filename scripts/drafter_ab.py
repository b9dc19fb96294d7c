"""The shipped drafters against those of an earlier commit, in one process: one engine each (same target, same
execution path and profile; each drafter with its own acceptance statistics, so its own automatic tree),
interleaved per prompt, so that the host's drift between runs cancels (docs/training.md, the H100 round).

    PYTHONPATH=. .venv/bin/python scripts/drafter_ab.py --previous dfa2620 --prompts 3
"""

from __future__ import annotations

import argparse
import subprocess
import tarfile
import tempfile
from io import BytesIO
from pathlib import Path

from gumiho.loader import build_engine

from scripts.engine_ab import ROOT, benchmark_prompts, interleave


def previous_drafters(commit: str, methods: list[str], folder: Path) -> dict[str, str]:
    """Each method's drafter folder as `commit` shipped it, extracted under `folder`."""
    paths = [f"assets/drafters/smollm2-135m-{m}" for m in methods]
    archive = subprocess.check_output(["git", "archive", commit, *paths], cwd=ROOT)
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(folder, filter="data")
    return {m: str(folder / path) for m, path in zip(methods, paths)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=3, help="first prompts of each set")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--previous", required=True, help="the commit whose drafters are 'previous'")
    parser.add_argument("--methods", nargs="+", default=["gumiho", "eagle2"])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        previous = build_engine(drafters=previous_drafters(args.previous, args.methods, Path(folder)), threads=2)
        shipped = build_engine(threads=2)
        interleave({"previous": lambda: previous, "shipped": lambda: shipped}, args.methods,
                   benchmark_prompts(args.prompts), args.tokens)


if __name__ == "__main__":
    main()
