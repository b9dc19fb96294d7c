"""What the command lines (`generate`, `bench`, `train`) share: one-line usage errors, argument types, the draft-tree
options, and quiet third-party libraries."""

from __future__ import annotations

import argparse
import sys
from typing import Any, Callable

from .errors import GumihoError


class OneLineParser(argparse.ArgumentParser):
    """Usage errors as one line on stderr, exit status 2."""

    def error(self, message: str):
        self.exit(2, f"error: {message} (see {self.prog} --help)\n")


def run_reporting_errors(command: Callable[[], int]) -> int:
    """`command()`, or exit status 2 with its GumihoError as one line on stderr."""
    try:
        return command()
    except GumihoError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def at_least(low: int) -> Callable[[str], int]:
    """An argument type: an integer of at least `low`."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be >= {low}")
        return value

    return parse


positive = at_least(1)
non_negative = at_least(0)


def unit_interval(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError("must be in [0, 1]")
    return value


def total_tokens(text: str) -> int | str:
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer or 'auto', got {text!r}") from None


def dtype_name(text: str) -> str:
    """argparse type for --dtype: auto or a dtype name (checked here, so a typo is a usage error)."""
    from .target import DTYPE_NAMES

    if text != "auto" and text not in DTYPE_NAMES:
        raise argparse.ArgumentTypeError(f"unknown dtype {text!r}; choose auto, float32, bfloat16 or float16")
    return text


def add_device_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", help="cpu, cuda, cuda:N or mps (default: cuda, else mps, else cpu)")
    parser.add_argument("--threads", type=positive, help="CPU threads for torch (default: all cores)")
    parser.add_argument("--dtype", type=dtype_name, default="auto",
                        help="auto (default: the fastest path in this machine's profile, measured once and cached), "
                             "float32, bfloat16, float16, or int4 (4-bit weights; CPU). bfloat16 on a CPU without "
                             "bf16 units runs with a warning")


def add_tree_arguments(parser: argparse.ArgumentParser) -> None:
    tree = parser.add_argument_group("draft tree (defaults depend on method and device)")
    tree.add_argument("--tree-top-k", type=int, help="candidates per expanded node (lookup: earlier matches "
                      "followed; recycle: table entries per node, at most 16)")
    tree.add_argument("--depth", type=int, help="EAGLE-2: expansion steps; Gumiho: draft depth minus 1; lookup, "
                      "recycle: draft depth")
    tree.add_argument("--total-tokens", type=total_tokens, help="nodes verified per cycle, root included (default "
                      "'auto': chosen from this machine's profile and the drafter's acceptance statistics)")
    tree.add_argument("--mlptopk", type=int, help="Gumiho: candidates per MLP head and branch")
    tree.add_argument("--pruning", type=int, help="Gumiho: nodes kept per MLP depth")
    tree.add_argument("--fta", action=argparse.BooleanOptionalAction, default=None,
                      help="Gumiho: Full Tree Attention (approximate; greedy only)")
    tree.add_argument("--mlp-parent-align", action=argparse.BooleanOptionalAction, default=True,
                      help="Gumiho: feed each MLP row its true serial parent (off = official code's quirk)")
    tree.add_argument("--serial-tree-mask", action=argparse.BooleanOptionalAction, default=True,
                      help="Gumiho: ancestor mask in the serial step (off = official code's causal mask)")
    tree.add_argument("--gamma", type=positive, help="MJSD: draft length (default 4)")
    tree.add_argument("--beams", type=positive, help="MJSD: beams (default 8)")
    tree.add_argument("--tau-acc", type=unit_interval, help="MJSD: accept the longest draft prefix with "
                      "min(1, P/Q) >= this threshold (default 0.9; approximate decoding)")
    tree.add_argument("--max-ngram", type=positive, help="lookup: the longest suffix of the text looked up "
                      "earlier in it (default 3)")
    tree.add_argument("--min-ngram", type=positive, help="lookup: the shortest suffix looked up (default 1)")
    tree.add_argument("--lookup-merge", type=non_negative, help="learned drafters and recycle: verify prompt "
                      "lookup's tree instead of drafting when the text's last N tokens occurred earlier (default 3; "
                      "0: off)")
    tree.add_argument("--lookup-branches", type=non_negative, help="EAGLE-2, Gumiho: in cycles that draft, add "
                      "prompt lookup's continuations of matches of N or more tokens to the tree (default 0: off)")
    tree.add_argument("--first-level", action=argparse.BooleanOptionalAction, default=None,
                      help="EAGLE-2, Gumiho: draft the root's top-k candidates only, side by side (the automatic "
                      "choice's 3-token tree where the lm_head computes rows together)")


def tree_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The options of `add_tree_arguments` as `TreeSettings.resolve` overrides (None: the default; so is 'auto').
    MJSD's --gamma and --beams are its depth and top_k; it verifies all it drafts (total_tokens = gamma + 1)."""
    return {
        "top_k": args.beams or args.tree_top_k, "depth": args.gamma or args.depth,
        "total_tokens": args.gamma + 1 if args.gamma else None if args.total_tokens == "auto" else args.total_tokens,
        "mlptopk": args.mlptopk, "pruning": args.pruning, "fta": args.fta,
        "mlp_parent_align": args.mlp_parent_align, "serial_tree_mask": args.serial_tree_mask,
        "tau_acc": args.tau_acc, "max_ngram": args.max_ngram, "min_ngram": args.min_ngram,
        "lookup_merge": args.lookup_merge, "lookup_branches": args.lookup_branches, "first_level": args.first_level,
    }


def quiet_libraries() -> None:
    """No transformers warnings or progress bars in command-line output."""
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
