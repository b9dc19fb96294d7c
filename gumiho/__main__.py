"""Command line: `python -m gumiho generate|bench|train|page ...` (bench, train, export and page live in their own
packages)."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from dataclasses import replace

from .cli import (OneLineParser, add_device_arguments, add_tree_arguments, positive, quiet_libraries,
                  run_reporting_errors, tree_overrides)
from .errors import GumihoError
from .prompts import read_prompts
from .trace import DRAFTED_METHODS, METHODS, WEIGHT_FREE_METHODS

# MJSD verifies its whole chain: no tree size to choose. Lookup and recycle have no folder to keep statistics in.
CALIBRATED = tuple(m for m in DRAFTED_METHODS if m != "mjsd" and m not in WEIGHT_FREE_METHODS)
BRANCHED = ("eagle2", "gumiho")  # the dynamic trees: lookup's branches join their pools (tree.merge_pools)


def check_tree_options(args: argparse.Namespace) -> None:
    """The tree options that are wrong whatever the model: refused before anything loads."""
    from .tree import FIRST_LEVEL_METHODS, RECYCLE_WIDTH, TreeSettings

    if args.total_tokens not in (None, "auto") and args.total_tokens < 1:
        raise GumihoError("--total-tokens must be >= 1 or 'auto'")
    if args.method != "mjsd" and (args.gamma or args.beams or args.tau_acc is not None):
        raise GumihoError("--gamma, --beams and --tau-acc are MJSD options (--method mjsd)")
    if args.method != "lookup" and (args.max_ngram is not None or args.min_ngram is not None):
        raise GumihoError("--max-ngram and --min-ngram are lookup options (--method lookup)")
    if args.lookup_merge and args.method not in (*CALIBRATED, "recycle"):
        raise GumihoError(f"--lookup-merge is an option of the learned drafters and recycle "
                          f"({', '.join(CALIBRATED)}, recycle)")
    if args.first_level and args.method not in FIRST_LEVEL_METHODS:  # TreeSettings.validate's words, before a load
        raise GumihoError(f"a first-level tree is an option of the dynamic-tree drafters "
                          f"({', '.join(FIRST_LEVEL_METHODS)}) without FTA, not of {args.method}")
    if args.lookup_branches and args.method not in BRANCHED:
        raise GumihoError(f"--lookup-branches is an option of the dynamic-tree drafters ({', '.join(BRANCHED)})")
    if args.method == "lookup":
        default = TreeSettings.default("lookup")
        low, high = args.min_ngram or default.min_ngram, args.max_ngram or default.max_ngram
        if low > high:
            raise GumihoError(f"--min-ngram ({low}) must not exceed --max-ngram ({high})")
    if args.method == "recycle" and args.tree_top_k is not None and args.tree_top_k > RECYCLE_WIDTH:
        raise GumihoError(f"recycle's table keeps {RECYCLE_WIDTH} next tokens per token: --tree-top-k must be at "
                          f"most {RECYCLE_WIDTH}")
    if args.method in WEIGHT_FREE_METHODS and args.drafter:
        raise GumihoError(f"{args.method} drafts without weights: --drafter does not apply to it")


def generate_main(args: argparse.Namespace) -> int:
    from .engine import GenerationConfig
    from .loader import build_engine
    from .mjsd import describe, mjsd_sampling
    from .sampling import SamplingConfig
    from .tree import TreeSettings

    if args.method not in METHODS:
        raise GumihoError(f"unknown method {args.method!r}; choose one of {', '.join(METHODS)}")
    check_tree_options(args)
    if args.prompt is None and args.prompts is None:
        raise GumihoError("give --prompt TEXT or --prompts FILE.jsonl")
    prompts = [args.prompt] if args.prompt is not None else read_prompts(args.prompts)
    if any(not p.strip() for p in prompts):
        raise GumihoError("the prompt is empty")
    sampling = SamplingConfig(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k)
    base = GenerationConfig(max_new_tokens=args.max_new_tokens, sampling=sampling, seed=args.seed,
                            chat=args.chat, trace=args.trace)
    drafters = {} if args.method == "ar" else {args.method: args.drafter}
    engine = build_engine(args.model, drafters, device=args.device, threads=args.threads, seed=args.seed,
                          dtype=args.dtype, lead=args.method, progress=True)
    tree = None
    if args.method != "ar":
        tree = TreeSettings.resolve(args.method, engine.target.device.type, tree_overrides(args),
                                    base=engine.default_tree(args.method))
    if engine.choice:
        print(f"[auto] {engine.choice.summary(args.method)}", file=sys.stderr)
    if args.method == "mjsd":
        print(f"[mjsd] {describe(tree, mjsd_sampling(sampling))}", file=sys.stderr)
    config = replace(base, tree=tree)
    for prompt in prompts:
        trace = engine.generate(prompt, args.method, config)
        if args.json:
            record = trace.to_dict()
            if not args.trace:
                record.pop("steps")
            print(json.dumps(record), flush=True)
        else:
            print(trace.text, flush=True)
        print(f"[{trace.method}] {trace.new_tokens} tokens in {trace.cycles} cycles, tau {trace.tau:.2f}, "
              f"{trace.tokens_per_s:.1f} tokens/s ({trace.finish_reason})", file=sys.stderr)
    return 0


def calibrate_main(args: argparse.Namespace) -> int:
    """Measure a drafter's acceptance statistics and write them beside its weights (or to --out)."""
    from pathlib import Path

    from .acceptance import Acceptance, file_name
    from .calibrate import PROMPTS, calibrate
    from .profile import TOP_KS
    from .loader import build_engine, shipped_drafter

    from .drafters import weights_kind

    if args.method not in CALIBRATED:
        raise GumihoError(f"calibrate needs a drafter method ({', '.join(CALIBRATED)}), got {args.method!r}")
    folder = args.drafter or shipped_drafter(args.model, args.method)
    out = Path(args.out or folder or "")
    if not args.out and (folder is None or not Path(folder).is_dir()):
        raise GumihoError("give --out FOLDER: the drafter is not a local folder to write acceptance.json into")
    prompts = tuple(read_prompts(args.prompts)) if args.prompts else PROMPTS
    engine = build_engine(args.model, {args.method: args.drafter}, device=args.device, threads=args.threads,
                          dtype=args.dtype, trees="default")
    borrowed = args.method if weights_kind(args.method) != args.method else ""
    top_ks = tuple(args.top_ks or TOP_KS)
    acceptance = calibrate(engine, args.method, top_ks=top_ks, prompts=prompts, max_new_tokens=args.max_new_tokens)
    kept = Acceptance.load(out, borrowed) if args.top_ks else None
    if kept is not None:  # recalibrated top_ks replace their old statistics; the others stay
        acceptance = Acceptance({**kept.prefix_ranks, **acceptance.prefix_ranks})
    out.mkdir(parents=True, exist_ok=True)
    acceptance.save(out, borrowed)
    taus = ", ".join(f"top_k {k}: {acceptance.tau(k, 16):.2f}" for k in sorted(acceptance.prefix_ranks))
    print(f"wrote {out / file_name(borrowed)} (tau at 16 tokens: {taus})", file=sys.stderr)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="python -m gumiho", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True, parser_class=OneLineParser)
    gen = commands.add_parser("generate", help="generate text with AR or a speculative method")
    gen.add_argument("--method", default="gumiho", help=" | ".join(METHODS))
    gen.add_argument("--model", help="model folder or Hub id (default: the embedded SmolLM2-135M-Instruct)")
    gen.add_argument("--drafter", help="drafter folder or Hub id, ours or an official Gumiho / EAGLE checkpoint "
                     "(default: the shipped one for the default model)")
    source = gen.add_mutually_exclusive_group()
    source.add_argument("--prompt", help="prompt text")
    source.add_argument("--prompts", help="JSONL file of prompts ('turns'[0] or 'prompt' per line)")
    gen.add_argument("--max-new-tokens", type=int, default=128)
    gen.add_argument("--temperature", type=float, default=0.0)
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--top-k", type=int, default=0, help="sampling top-k (0 = off)")
    gen.add_argument("--seed", type=int, default=0)
    gen.add_argument("--chat", action=argparse.BooleanOptionalAction, default=True, help="apply the chat template")
    gen.add_argument("--trace", action="store_true", help="record every cycle's tree (in --json output as 'steps')")
    gen.add_argument("--json", action="store_true", help="one JSON object per prompt on stdout")
    add_device_arguments(gen)
    add_tree_arguments(gen)
    cal = commands.add_parser("calibrate", help="measure a drafter's acceptance statistics (acceptance.json) for "
                              "the automatic trees")
    cal.add_argument("--method", default="gumiho", help=" | ".join(CALIBRATED))
    cal.add_argument("--model", help="model folder or Hub id (default: the embedded SmolLM2-135M-Instruct)")
    cal.add_argument("--drafter", help="drafter folder (default: the shipped one)")
    cal.add_argument("--out", help="folder for acceptance.json (default: the drafter's folder)")
    cal.add_argument("--prompts", help="JSONL file of calibration prompts ('turns'[0] or 'prompt' per line; default: "
                     "eight generic prompts). The shipped statistics: data/calibration/prompts.jsonl")
    cal.add_argument("--max-new-tokens", type=int, default=64, help="tokens per calibration prompt")
    cal.add_argument("--top-ks", type=positive, nargs="+", metavar="K",
                     help="calibrate only these top_ks, keeping the file's statistics for the others "
                          "(default: every profiled top_k, replacing the file)")
    add_device_arguments(cal)
    commands.add_parser("bench", help="benchmark harness (python -m gumiho bench --help)", add_help=False)
    commands.add_parser("train", help="train a drafter (python -m gumiho train --help)", add_help=False)
    commands.add_parser("export", help="write a drafter in the papers' formats (python -m gumiho export --help)",
                        add_help=False)
    commands.add_parser("page", help="a folder that replays traces with no server (python -m gumiho page --help)",
                        add_help=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    try:
        if argv and argv[0] in ("bench", "train", "export", "page"):
            import importlib

            return importlib.import_module(f"gumiho.{argv[0]}.__main__").main(argv[1:])
        args = build_parser().parse_args(argv)
        quiet_libraries()
        command = calibrate_main if args.command == "calibrate" else generate_main
        return run_reporting_errors(lambda: command(args))
    except BrokenPipeError:  # the reader went away (`... | head`): stop quietly, as other command-line tools do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


if __name__ == "__main__":
    sys.exit(main())
