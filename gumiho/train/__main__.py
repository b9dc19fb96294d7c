"""Command line of the training pipeline.

    python -m gumiho.train prepare --out DIR [--split train|heldout] [--no-distill] ...   # data + target features
    python -m gumiho.train refeature --data DIR --out DIR --dtype int4                    # features of another path
    python -m gumiho.train prompts --out FILE.jsonl [--per-task N]                        # task-shaped prompts
    python -m gumiho.train --drafter eagle2|gumiho|medusa|hydra --data DIR --out RUN ...  # train (resumable)
    python -m gumiho.train eval --drafter-dir FOLDER --heldout DIR [--mt-bench N] ...     # accuracy and tau
    python -m gumiho.train ship --run RUN --dest FOLDER                                   # fp16 drafter + model card
    python -m gumiho.train frequency --drafter-dir FOLDER ...                             # rank the draft vocabulary
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from dataclasses import MISSING, fields
from pathlib import Path

from ..cli import OneLineParser, run_reporting_errors
from ..errors import GumihoError


def _add_dataclass_arguments(parser: argparse.ArgumentParser, cls, skip: tuple[str, ...] = ()) -> None:
    """One --option per dataclass field (booleans get --x / --no-x), defaults taken from the dataclass."""
    for f in fields(cls):
        if f.name in skip:
            continue
        flag, text = "--" + f.name.replace("_", "-"), f.metadata.get("help", "")
        if f.default is MISSING:
            parser.add_argument(flag, required=True, help=text)
        elif isinstance(f.default, bool):
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=f.default, help=text)
        else:
            shown = f" (default: {f.default})" if f.default != "" else ""
            parser.add_argument(flag, type=type(f.default), default=f.default, help=text + shown)


def _config(cls, args: argparse.Namespace):
    return cls(**{f.name: getattr(args, f.name) for f in fields(cls) if hasattr(args, f.name)})


def _target(args: argparse.Namespace):
    import torch

    from ..target import load_target

    if args.dtype == "int4":  # the engine's int4 path: features, tau and generation as a CPU user gets them
        from ..profile import ExecPath, target_for

        base = load_target(args.model, device=args.device, threads=args.threads, dtype=torch.float32)
        return target_for(base, ExecPath("int4", "lean", pack=base.pack))
    dtype = {"auto": None, "float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[args.dtype]
    return load_target(args.model, device=args.device, threads=args.threads, dtype=dtype)


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", help="target model folder or Hub id (default: SmolLM2-135M-Instruct)")
    parser.add_argument("--device", help="cpu, cuda ... (default: cuda when available)")
    parser.add_argument("--threads", type=int, default=2, help="CPU threads for torch")
    parser.add_argument("--dtype", choices=["auto", "float32", "bfloat16", "float16", "int4"], default="auto",
                        help="target dtype (auto: fp32 on CPU, bf16 on GPUs); int4: the engine's 4-bit path (CPU), "
                             "whose features and greedy replies a drafter meets there")


def prepare_main(argv: list[str]) -> int:
    from .prepare import PrepareConfig, prepare

    parser = OneLineParser(prog="python -m gumiho.train prepare", description="conversations + cached target features")
    _add_dataclass_arguments(parser, PrepareConfig)
    _common(parser)
    args = parser.parse_args(argv)
    if args.split not in ("train", "heldout"):
        raise GumihoError(f"--split must be train or heldout, not {args.split!r}")
    if args.turns < 1:
        raise GumihoError(f"--turns must be at least 1, not {args.turns}")
    if args.engine:
        from .distill import check_engine_method

        if not args.distill:
            raise GumihoError("--engine writes the replies: it needs self-distillation (drop --no-distill)")
        check_engine_method(args.engine, args.model)
    out = prepare(_config(PrepareConfig, args), _target(args))
    print(out)
    return 0


def refeature_main(argv: list[str]) -> int:
    from .features import shard_paths
    from .prepare import refeature

    parser = OneLineParser(prog="python -m gumiho.train refeature",
                           description="a prepared folder's conversations with features from another path")
    parser.add_argument("--data", required=True, help="feature folder from prepare")
    parser.add_argument("--out", required=True, help="folder for the new shards")
    _common(parser)
    args = parser.parse_args(argv)
    if Path(args.out).resolve() == Path(args.data).resolve():
        raise GumihoError("--out must be another folder than --data")
    shard_paths(args.data)  # before the model loads
    print(refeature(args.data, args.out, _target(args)))
    return 0


def prompts_main(argv: list[str]) -> int:
    from .data import load_conversations, split
    from .tasks import TASKS, benchmark_ngrams, summary_prompts, task_prompts, write_jsonl

    parser = OneLineParser(prog="python -m gumiho.train prompts",
                           description="ShareGPT first turns (training side of the split) that ask for the benchmark "
                                       "sets' kinds of task, none overlapping a benchmark prompt; for prepare --data")
    parser.add_argument("--out", required=True, help="JSONL file to write ({id, prompt, task} per line)")
    parser.add_argument("--per-task", type=int, default=400,
                        help="at most this many prompts of each task (0: none, with --summaries)")
    parser.add_argument("--tasks", nargs="+", choices=TASKS, default=list(TASKS))
    parser.add_argument("--data", default="", help="ShareGPT JSON or conversations .jsonl (default: the package's)")
    parser.add_argument("--benchmarks", default=str(Path(__file__).resolve().parents[2] / "data" / "benchmarks"),
                        help="folder of the benchmark .jsonl files whose prompts must not be trained on")
    parser.add_argument("--heldout-percent", type=float, default=2.0, help="as prepare's: the split's held-out share")
    parser.add_argument("--split", default="train", choices=["train", "heldout"], help="side of the split to draw from")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--summaries", type=int, default=0,
                        help="also this many synthetic summary tasks: long prose replies under a request to summarise "
                             "them (conversations other than the task prompts')")
    parser.add_argument("--exclude", action="append", default=[],
                        help="a prompts .jsonl whose ids to leave out, e.g. an earlier round's (repeatable)")
    args = parser.parse_args(argv)
    if args.per_task < 0 or args.summaries < 0 or not (args.per_task or args.summaries):
        raise GumihoError(f"--per-task must be at least 1 (or 0 with --summaries), not {args.per_task}")
    files = sorted(Path(args.benchmarks).glob("*.jsonl"))
    if not files:
        raise GumihoError(f"no benchmark .jsonl files in {args.benchmarks}: they are what the prompts must not match")
    excluded = {c.id for path in args.exclude for c in load_conversations(path)}
    train, heldout = split(load_conversations(args.data or None), args.heldout_percent)
    side, banned = (train if args.split == "train" else heldout), benchmark_ngrams(files)
    records = task_prompts(side, args.per_task, banned, args.tasks, args.seed)
    if args.summaries:
        records += summary_prompts(side, args.summaries, banned, args.seed, skip={r["id"] for r in records})
    records = [r for r in records if r["id"] not in excluded]
    write_jsonl(Path(args.out), records)
    counts = {t: sum(r["task"] == t for r in records) for t in args.tasks}
    print(f"{args.out}: {len(records)} prompts ({', '.join(f'{t} {n}' for t, n in counts.items())})")
    return 0


def train_main(argv: list[str]) -> int:
    from .trainer import TrainConfig, check_kind, train

    parser = OneLineParser(prog="python -m gumiho.train",
                           description="train an EAGLE-2, Gumiho, Medusa or Hydra drafter on cached features")
    _add_dataclass_arguments(parser, TrainConfig)
    _common(parser)
    args = parser.parse_args(argv)
    config = _config(TrainConfig, args)
    check_kind(config.drafter, config.blocks)
    missing = [folder for folder in config.data.split(",") if not Path(folder).is_dir()]
    if missing:
        raise GumihoError(f"no feature folder {missing[0]}; run `python -m gumiho.train prepare` first")
    run = train(config, _target(args))
    print(run)
    return 0


def eval_main(argv: list[str]) -> int:
    from ..drafters import Drafter
    from .evaluate import chain_accuracy, tau_on_prompts, vocab_coverage

    parser = OneLineParser(prog="python -m gumiho.train eval",
                           description="held-out chain accuracy and tau of a drafter")
    parser.add_argument("--drafter-dir", required=True, help="drafter folder (config.json + model.safetensors)")
    parser.add_argument("--heldout", help="feature folder of held-out conversations (from prepare --split heldout)")
    parser.add_argument("--prompts", action="append", default=[], help="JSONL prompts file for tau (repeatable)")
    parser.add_argument("--limit", type=int, default=0, help="use only the first N prompts of each file (0 = all)")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--full-vocab", action="store_true",
                        help="propose from the whole vocabulary, not the drafter's draft vocabulary (what it costs)")
    parser.add_argument("--out", help="write the results as JSON here")
    _common(parser)
    args = parser.parse_args(argv)
    prepared = Path(args.heldout or ".") / "prepare.json"
    if args.heldout and prepared.is_file() and not json.loads(prepared.read_text()).get("distill", True):
        # Depth >= 2 feeds the draft the target's greedy tokens, so the replies must be the target's own.
        raise GumihoError(f"{args.heldout} holds ShareGPT's replies (prepare --no-distill); chain accuracy needs "
                          "the target's own replies: prepare --split heldout without --no-distill")
    drafter = Drafter.from_pretrained(args.drafter_dir)
    if args.full_vocab:
        drafter.use_full_vocab()
    target = _target(args)
    results: dict = {"drafter": args.drafter_dir, "max_new_tokens": args.max_new_tokens,
                     "vocabulary": "full" if args.full_vocab else "draft"}
    if args.heldout:
        from .features import load_sequences

        heldout = load_sequences(args.heldout)
        results["chain_accuracy"] = chain_accuracy(drafter, target, heldout)
        results["draft_vocab_coverage"] = vocab_coverage(drafter, target, heldout)
    if args.prompts:
        results["tau"] = tau_on_prompts(drafter, target, args.prompts, args.limit, args.max_new_tokens)
    text = json.dumps(results, indent=2)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    return 0


def ship_main(argv: list[str]) -> int:
    from .ship import ship

    parser = OneLineParser(prog="python -m gumiho.train ship", description="write a trained run as a drafter folder")
    parser.add_argument("--run", required=True, help="training run folder")
    parser.add_argument("--dest", required=True, help="drafter folder to write")
    parser.add_argument("--eval", action="append", default=[], help="JSON from `eval --out` for the model card (repeatable)")
    args = parser.parse_args(argv)
    print(ship(args.run, args.dest, args.eval))
    return 0


def frequency_main(argv: list[str]) -> int:
    from transformers import AutoTokenizer

    from ..drafters.base import Drafter
    from ..drafters.frequency import write_counts
    from ..target import model_folder
    from .data import load_conversations, reply_counts, split

    parser = OneLineParser(prog="python -m gumiho.train frequency",
                           description="count the draft-vocabulary ids of drafter folders in assistant replies "
                                       "(ShareGPT's training side by default) and write vocab_frequency.safetensors "
                                       "beside each: at inference a drafter proposes from its most frequent ids")
    parser.add_argument("--drafter-dir", nargs="+", required=True, help="drafter folders (ours, with a draft vocabulary)")
    parser.add_argument("--conversations", type=int, default=20000, help="first conversations of the training side")
    parser.add_argument("--data", default="", help="ShareGPT JSON or conversations .jsonl (default: the package's)")
    parser.add_argument("--model", help="target model folder or Hub id, for its tokenizer (default: SmolLM2-135M-Instruct)")
    parser.add_argument("--heldout-percent", type=float, default=2.0, help="as prepare's: the split's held-out share")
    args = parser.parse_args(argv)
    if args.conversations < 1:
        raise GumihoError(f"--conversations must be at least 1, not {args.conversations}")
    drafters = {folder: Drafter.from_pretrained(folder) for folder in args.drafter_dir}
    for folder, drafter in drafters.items():
        if drafter.draft_vocab is None:
            raise GumihoError(f"{folder} proposes from the whole vocabulary: there is no draft vocabulary to rank")
    tokenizer = AutoTokenizer.from_pretrained(model_folder(args.model))
    train, _ = split(load_conversations(args.data or None), args.heldout_percent)
    end = tokenizer.convert_tokens_to_ids("<|im_end|>") if "<|im_end|>" in tokenizer.get_vocab() \
        else tokenizer.eos_token_id
    counts = reply_counts(train[: args.conversations], tokenizer, end)
    for folder, drafter in drafters.items():
        kept = counts[drafter.draft_vocab]
        path = write_counts(Path(folder), kept)
        print(f"{path}: {int(counts.sum())} reply tokens of {min(args.conversations, len(train))} conversations, "
              f"{100 * kept.sum().item() / max(counts.sum().item(), 1):.1f}% of them in the draft vocabulary")
    return 0


COMMANDS = {"prepare": prepare_main, "refeature": refeature_main, "prompts": prompts_main, "eval": eval_main,
            "ship": ship_main, "frequency": frequency_main}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    import transformers

    transformers.logging.set_verbosity_error()
    command, args = (COMMANDS[argv[0]], argv[1:]) if argv and argv[0] in COMMANDS else (train_main, argv)
    return run_reporting_errors(lambda: command(args))


if __name__ == "__main__":
    sys.exit(main())
