"""python -m gumiho export --drafter FOLDER --format official|eagle --out DIR: our drafter in a paper's format."""

from __future__ import annotations

import argparse
import sys

from ..errors import GumihoError
from . import DTYPES, FORMATS, check_format, check_out, export_drafter


def build_parser() -> argparse.ArgumentParser:
    from ..cli import OneLineParser

    p = OneLineParser(prog="python -m gumiho export", description=__doc__)
    p.add_argument("--drafter", required=True, help="our drafter folder (config.json + model.safetensors)")
    p.add_argument("--format", required=True, choices=FORMATS,
                   help="official: the drafter's own paper's format (Gumiho or EAGLE); eagle: EAGLE-2 drafters in "
                        "the EAGLE format (what vLLM's EAGLE loader reads)")
    p.add_argument("--out", required=True, help="new folder for pytorch_model.bin and config.json")
    p.add_argument("--model", help="the drafter's target, whose embedding the checkpoint holds (default: the "
                                   "embedded SmolLM2-135M-Instruct)")
    p.add_argument("--dtype", choices=DTYPES, default="float16", help="weights' dtype (the official ones are fp16)")
    return p


def run(args: argparse.Namespace) -> int:
    from ..drafters import Drafter
    from ..target import load_target

    drafter = Drafter.from_pretrained(args.drafter)
    check_format(drafter.kind, args.format)
    check_out(args.out)
    if drafter.draft_vocab is not None:
        print(f"note: the draft vocabulary ({drafter.config.draft_vocab_size} of {drafter.config.vocab_size} tokens) "
              "is dropped: the official formats score the target's full vocabulary", file=sys.stderr)
    if args.format == "eagle" and drafter.transformer.fc.bias.any():
        print("note: vLLM's EAGLE drafter has no fc bias and skips fc.bias when loading; the official EAGLE code "
              "uses it (see docs/official-checkpoints.md)", file=sys.stderr)
    target = load_target(args.model, device="cpu")
    out = export_drafter(drafter, target.embed_weight, target.max_context, args.format, args.out, DTYPES[args.dtype])
    print(f"wrote {out}/pytorch_model.bin and config.json ({args.format} format, {args.dtype})", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    try:
        return run(args)
    except GumihoError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
