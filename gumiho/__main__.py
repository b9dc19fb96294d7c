"""Command line: `python -m gumiho generate|bench|train ...` (bench and train live in their own packages)."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from dataclasses import replace
from pathlib import Path

from .errors import GumihoError


def _quiet_libraries() -> None:
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()


def read_prompts(path: str) -> list[str]:
    """Prompts from a JSONL file: `turns[0]` (the benchmark format) or `prompt` on each line."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise GumihoError(f"cannot read prompts file {path}: {exc.strerror if isinstance(exc, OSError) else exc}")
    prompts = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            prompt = record["turns"][0] if "turns" in record else record["prompt"]
        except (json.JSONDecodeError, KeyError, IndexError, TypeError):
            raise GumihoError(f"{path}:{number}: expected a JSON object with 'turns' (a list) or 'prompt'")
        if not isinstance(prompt, str):
            raise GumihoError(f"{path}:{number}: the prompt is not a string")
        prompts.append(prompt)
    if not prompts:
        raise GumihoError(f"{path} holds no prompts")
    return prompts


def total_tokens(text: str) -> int | str:
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer or 'auto', got {text!r}") from None


def add_tree_arguments(parser: argparse.ArgumentParser) -> None:
    tree = parser.add_argument_group("draft tree (defaults depend on method and device)")
    tree.add_argument("--tree-top-k", type=int, help="candidates per expanded node")
    tree.add_argument("--depth", type=int, help="EAGLE-2: expansion steps; Gumiho: draft depth minus 1")
    tree.add_argument("--total-tokens", type=total_tokens, help="nodes verified per cycle, root included, or "
                      "'auto': measured on this device (and top-k with it, unless --tree-top-k is given; cached)")
    tree.add_argument("--mlptopk", type=int, help="Gumiho: candidates per MLP head and branch")
    tree.add_argument("--pruning", type=int, help="Gumiho: nodes kept per MLP depth")
    tree.add_argument("--fta", action=argparse.BooleanOptionalAction, default=None,
                      help="Gumiho: Full Tree Attention (approximate; greedy only)")
    tree.add_argument("--mlp-parent-align", action=argparse.BooleanOptionalAction, default=True,
                      help="Gumiho: feed each MLP row its true serial parent (off = official code's quirk)")
    tree.add_argument("--serial-tree-mask", action=argparse.BooleanOptionalAction, default=True,
                      help="Gumiho: ancestor mask in the serial step (off = official code's causal mask)")


def tree_settings(args: argparse.Namespace, method: str, device_type: str):
    from .tree import TreeSettings

    if method == "ar":
        return None
    overrides = {
        "top_k": args.tree_top_k, "depth": args.depth,
        "total_tokens": None if args.total_tokens == "auto" else args.total_tokens,
        "mlptopk": args.mlptopk, "pruning": args.pruning, "fta": args.fta,
        "mlp_parent_align": args.mlp_parent_align, "serial_tree_mask": args.serial_tree_mask,
    }
    return replace(TreeSettings.default(method, device_type), **{k: v for k, v in overrides.items() if v is not None})


def generate_main(args: argparse.Namespace) -> int:
    from .engine import METHODS, GenerationConfig
    from .loader import build_engine
    from .sampling import SamplingConfig

    if args.method not in METHODS:
        raise GumihoError(f"unknown method {args.method!r}; choose one of {', '.join(METHODS)}")
    if args.prompt is None and args.prompts is None:
        raise GumihoError("give --prompt TEXT or --prompts FILE.jsonl")
    prompts = [args.prompt] if args.prompt is not None else read_prompts(args.prompts)
    if any(not p.strip() for p in prompts):
        raise GumihoError("the prompt is empty")
    sampling = SamplingConfig(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k)
    base = GenerationConfig(max_new_tokens=args.max_new_tokens, sampling=sampling, seed=args.seed,
                            chat=args.chat, trace=args.trace)
    drafters = {} if args.method == "ar" else {args.method: args.drafter}
    engine = build_engine(args.model, drafters, device=args.device, threads=args.threads, seed=args.seed)
    tree = tree_settings(args, args.method, engine.target.device.type)
    if tree is not None and args.total_tokens == "auto":
        from .bench.tree_size import TOP_KS, cached_auto_tree

        top_ks = (args.tree_top_k,) if args.tree_top_k else TOP_KS
        choice = cached_auto_tree(engine, args.method, tree, top_ks)
        tree, best = choice.settings, choice.candidates[0]
        print(f"[auto tree] top_k {tree.top_k}, total_tokens {tree.total_tokens}, predicted {best.speedup:.2f}x "
              "the AR loop" + (" (slower: the drafter is not accurate enough here)" if best.speedup < 1 else ""),
              file=sys.stderr)
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


class OneLineParser(argparse.ArgumentParser):
    """Usage errors as one line on stderr, exit status 2."""

    def error(self, message: str):
        self.exit(2, f"error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="python -m gumiho", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True, parser_class=OneLineParser)
    gen = commands.add_parser("generate", help="generate text with AR, EAGLE-2 or Gumiho decoding")
    gen.add_argument("--method", default="gumiho", help="ar | eagle2 | gumiho")
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
    gen.add_argument("--device", help="cpu, cuda, cuda:1 ... (default: cuda when available)")
    gen.add_argument("--threads", type=int, help="CPU threads for torch")
    add_tree_arguments(gen)
    commands.add_parser("bench", help="benchmark harness (python -m gumiho bench --help)", add_help=False)
    commands.add_parser("train", help="train a drafter (python -m gumiho train --help)", add_help=False)
    commands.add_parser("export", help="write a drafter in the papers' formats (python -m gumiho export --help)",
                        add_help=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    try:
        if argv and argv[0] in ("bench", "train", "export"):
            import importlib

            return importlib.import_module(f"gumiho.{argv[0]}.__main__").main(argv[1:])
        args = build_parser().parse_args(argv)
        _quiet_libraries()
        return generate_main(args)
    except GumihoError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # the reader went away (`... | head`): stop quietly, as other command-line tools do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


if __name__ == "__main__":
    sys.exit(main())
