"""`python -m gumiho bench` (or `python -m gumiho.bench`): τ and speed-up of EAGLE-2 and Gumiho over AR decoding.

Quick mode (4 prompts per task, 128 new tokens, T = 0):
    python -m gumiho bench --quick
Full run (80 prompts per task, 256 new tokens, T = 0; add `--temperatures 0 1` for sampling too). It takes hours
on a CPU: every finished prompt is journaled, and the same command with --resume continues a stopped run:
    python -m gumiho bench --name cpu --resume
    python -m gumiho bench --name cpu --status        # how far it got, and its table so far
"""

from __future__ import annotations

import argparse
import shlex
import sys
from datetime import datetime, timezone
from pathlib import Path

from ..cli import OneLineParser, add_device_arguments, positive, quiet_libraries, run_reporting_errors, total_tokens
from ..errors import GumihoError
from .datasets import DATASETS, DEFAULT_DIR
from ..drafters import weights_kind
from .harness import DEFAULT_VARIANTS, DRAFTED, VARIANTS, BenchSettings, make_variants
from .reference import LLAMA_CPP, check_llama_cpp, llama_cpp_available, llama_cpp_problem
from ..target import DEFAULT_MODEL

RESULTS = Path(__file__).resolve().parents[2] / "assets" / "bench"
QUICK = {"limit": 4, "max_new_tokens": 128}


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="python -m gumiho bench", description=__doc__,
                      formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--methods", nargs="+",
                   help=f"any of {' '.join(VARIANTS)} (transformers: plain model.generate in the engine's dtype; "
                        "transformers-fp32 / -bf16 / -fp16 in that dtype; llama.cpp: llama-cpp-python on the "
                        f"embedded model's GGUF, optional). Default: {' '.join(DEFAULT_VARIANTS)}, and llama.cpp "
                        "where llama_cpp imports and the model is the embedded one")
    p.add_argument("--datasets", nargs="+", default=list(DATASETS),
                   help=f"names in --data ({' '.join(DATASETS)}) or paths to .jsonl files")
    p.add_argument("--data", type=Path, default=DEFAULT_DIR, help="folder of the benchmark .jsonl files")
    p.add_argument("--limit", type=positive, help="prompts per dataset (default: all; 4 with --quick)")
    p.add_argument("--max-new-tokens", type=positive, help="default 256 (128 with --quick)")
    p.add_argument("--temperatures", nargs="+", type=float, default=[0.0], help="e.g. 0 1")
    p.add_argument("--seeds", nargs="+", type=int, default=[0], help="sampling seeds (T > 0 runs once per seed)")
    p.add_argument("--both-turns", action="store_true", help="MT-Bench: also the second turn (after AR's answer)")
    p.add_argument("--warmup", type=int, default=1, help="warm-up rounds of every method on the first prompt")
    p.add_argument("--total-tokens", type=total_tokens,
                   help="tree budget for EAGLE-2 and Gumiho alike (default 'auto': each method's automatic choice)")
    p.add_argument("--tree-top-k", type=positive, help="top_k for both drafters (default: the automatic choice)")
    p.add_argument("--quick", action="store_true", help="4 prompts per task, 128 new tokens (unless given)")
    p.add_argument("--model", help="target model (default: the embedded SmolLM2-135M-Instruct)")
    p.add_argument("--eagle2-drafter", help="EAGLE-2 drafter folder (default: the shipped one; EAGLE-1 and MJSD "
                   "draft with it too)")
    p.add_argument("--gumiho-drafter", help="Gumiho drafter folder (default: the shipped one)")
    p.add_argument("--drafter", action="append", default=[], metavar="METHOD=FOLDER",
                   help="drafter folder of any method, e.g. medusa=runs/medusa/drafter (repeatable)")
    add_device_arguments(p)
    p.add_argument("--out", type=Path, default=RESULTS, help="results folder (default: assets/bench)")
    p.add_argument("--name", help="results file stem (default: <device>[-quick])")
    p.add_argument("--resume", action="store_true",
                   help="continue the unfinished run journaled in <out>/<name>.partial.jsonl (same arguments)")
    p.add_argument("--status", action="store_true",
                   help="how far the run journaled in <out>/<name>.partial.jsonl has got, and its table so far "
                        "(loads no model)")
    p.add_argument("--cost-repeats", type=positive, default=5, help="timed repeats per size of the cost curve")
    p.add_argument("--no-profile", dest="profile", action="store_false", help="skip the per-cycle profile")
    p.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bars")
    return p


def drafter_folders(args: argparse.Namespace) -> dict[str, str | None]:
    """method -> the drafter folder asked for (None: the shipped one). EAGLE-1 and MJSD draft with the EAGLE-2
    drafter's weights, so --eagle2-drafter is theirs too unless --drafter names one."""
    folders: dict[str, str | None] = {m: None for m in DRAFTED}
    for m in DRAFTED:
        if weights_kind(m) == "eagle2":
            folders[m] = args.eagle2_drafter
    folders["gumiho"] = args.gumiho_drafter
    for item in args.drafter:
        method, sep, folder = item.partition("=")
        if not sep or method not in DRAFTED or not folder:
            raise GumihoError(f"--drafter takes METHOD=FOLDER with METHOD one of {', '.join(DRAFTED)}, got {item!r}")
        folders[method] = folder
    return folders


def choose_trees(engine, args) -> dict:
    """The tree per drafter method: the engine's automatic choice (per method), or --total-tokens / --tree-top-k for
    every drafter alike (a static tree takes at most its own size, and so does a lookup or recycle tree: what its
    shape can draft; MJSD keeps its own beams and chain)."""
    from dataclasses import replace

    from ..static_tree import STATIC_METHODS, capped_total
    from ..trace import WEIGHT_FREE_METHODS
    from ..tree import TreeSettings

    trees = {}
    for m in engine.drafters:
        base = engine.default_tree(m)
        total = None if args.total_tokens == "auto" else args.total_tokens
        if m in STATIC_METHODS and total is not None:
            total = capped_total(m, base.depth, total)
        if m in WEIGHT_FREE_METHODS and total is not None:
            total = min(total, replace(base, top_k=args.tree_top_k or base.top_k).pool_size(m) + 1)
        overrides = {} if m == "mjsd" else {"total_tokens": total, "top_k": args.tree_top_k}
        trees[m] = TreeSettings.resolve(m, engine.target.device.type, overrides, base=base)
    return trees


def bench_settings(args: argparse.Namespace) -> BenchSettings:
    """Validate the arguments (before any model loads) and apply --quick's defaults."""
    from .datasets import load_questions

    if args.quick:
        args.limit = args.limit or QUICK["limit"]
        args.max_new_tokens = args.max_new_tokens or QUICK["max_new_tokens"]
    if any(t < 0 for t in args.temperatures):
        raise GumihoError("temperatures must be >= 0")
    if isinstance(args.total_tokens, int) and args.total_tokens < 1:
        raise GumihoError("--total-tokens must be >= 1 or 'auto'")
    if args.warmup < 0:
        raise GumihoError("--warmup must be >= 0")
    if args.methods is None:
        embedded = args.model in (None, DEFAULT_MODEL)
        problem = llama_cpp_problem() if embedded else "it runs the embedded model's GGUF only"
        args.methods = [*DEFAULT_VARIANTS, *([] if problem else [LLAMA_CPP])]
        if problem and llama_cpp_available():  # installed, yet no row: say why
            print(f"[llama.cpp] row left out: {problem}", file=sys.stderr)
    unknown = [m for m in args.methods if m not in VARIANTS]
    if unknown:
        raise GumihoError(f"unknown method {unknown[0]!r}; choose from {', '.join(VARIANTS)}")
    if LLAMA_CPP in args.methods:
        check_llama_cpp(args.model)
    settings = BenchSettings(datasets=args.datasets, data_dir=args.data, limit=args.limit,
                             max_new_tokens=args.max_new_tokens or 256, temperatures=tuple(args.temperatures),
                             seeds=tuple(args.seeds), warmup=args.warmup, both_turns=args.both_turns)
    names = [load_questions(name, settings.data_dir, 1)[0].dataset for name in settings.datasets]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:  # results are keyed by dataset name: two sets of one name would be mixed up
        raise GumihoError(f"dataset {repeated[0]!r} is given twice (datasets are told apart by file name)")
    return settings


def run_identity(engine, args: argparse.Namespace, settings: BenchSettings) -> dict:
    """What a resumed run must share with the journal it continues: settings, prompts, model, drafter weights and
    machine (contents, not paths, so a run can move to another checkout)."""
    import hashlib
    import json

    from .datasets import load_questions
    from .journal import weights_digest
    from .machine import describe

    questions = [[q.dataset, q.question_id, q.turns] for name in settings.datasets
                 for q in load_questions(name, settings.data_dir, settings.limit)]
    machine = describe(engine.target.device, engine.target.dtype, engine.target.pack, engine.target.forward,
                       engine.target.int4)
    return {"settings": {k: v for k, v in settings.to_dict().items() if k != "data_dir"},
            "prompts": hashlib.sha256(json.dumps(questions).encode()).hexdigest()[:16],
            "methods": list(args.methods), "total_tokens": args.total_tokens, "tree_top_k": args.tree_top_k,
            "model": engine.target.name, "drafters": {m: weights_digest(d) for m, d in engine.drafters.items()},
            "machine": {k: machine[k] for k in ("device", "device_name", "threads", "dtype", "packed_matmuls")}}


def execute(engine, args: argparse.Namespace, argv: list[str], settings: BenchSettings) -> dict[str, Path]:
    """Cost curve, tree choice, the interleaved runs, the profile; writes the results and returns their paths.

    Every finished conversation is journaled (`<name>.partial.jsonl`), so `--resume` continues a stopped run with
    the cost curve and trees it chose."""
    from dataclasses import asdict

    import pandas as pd
    import torch

    from ..tree import TreeSettings
    from .breakdown import profile
    from .datasets import load_questions
    from .harness import run_bench
    from .journal import MIN_CPU_SHARE, Journal
    from .machine import LoadMonitor, describe
    from .metrics import TAU_DEFINITION, add_speedups, summarize
    from .metrics import __doc__ as metric_doc
    from .report import speed_table, write
    from .cost_curve import CostCurve, measure_cost_curve
    from .reference import References, baseline_dtype, is_reference

    target = engine.target
    name = run_name(args, target.device.type)
    cpu_threads = torch.get_num_threads() if target.device.type == "cpu" else None
    journal = Journal.open(args.out / f"{name}.partial.jsonl", run_identity(engine, args, settings), args.resume,
                           cpu_threads)
    if journal.records:
        print(f"resuming {journal.path}: {len(journal.done)} conversations done"
              + (f", {journal.redo} to measure again (their CPU share was below {MIN_CPU_SHARE:.0%} of the run's "
                 "median: the machine was busy)" if journal.redo else ""), file=sys.stderr)
    print(TAU_DEFINITION, file=sys.stderr)
    with LoadMonitor() as load:
        if journal.setup is None:
            cost = measure_cost_curve(target, repeats=args.cost_repeats, progress=args.progress)
            trees = choose_trees(engine, args)
            choice = engine.choice.to_dict() if engine.choice else None
            journal.begin({"command": "python -m gumiho bench " + shlex.join(argv), "cost_curve": asdict(cost),
                           "trees": {m: t.to_dict() for m, t in trees.items()}, "auto_tree": {}, "choice": choice})
        else:
            journal.begin()
        cost = CostCurve(**journal.setup["cost_curve"])
        trees = {m: TreeSettings(**t) for m, t in journal.setup["trees"].items()}
        variants = make_variants(args.methods, trees, baseline_dtype(target))
        needs_reference = any(is_reference(v.name) for v in variants)
        reference = References(target, args.model or DEFAULT_MODEL) if needs_reference else None
        per_prompt = add_speedups(run_bench(engine, variants, settings, progress=args.progress, done=journal.done,
                                            on_job=lambda key, rows: journal.record(key, rows, load.take()),
                                            reference=reference))
        first = load_questions(settings.datasets[0], settings.data_dir, 1)[0].turns[0]
        prof = profile(engine, variants, first, settings.max_new_tokens) if args.profile else pd.DataFrame()
    summary = summarize(per_prompt)
    result = {
        "name": name,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": "python -m gumiho bench " + shlex.join(a for a in argv if a != "--resume"),
        "duration_s": round(journal.duration_s(), 1),
        "segments": journal.segments(),
        "machine": describe(target.device, target.dtype, target.pack, target.forward, target.int4, target.fetch,
                            target.attention, target.prompts),
        "load": load.summary(torch.get_num_threads(), earlier=journal.earlier_load()),
        "model": target.name,
        "drafters": dict(engine.drafter_names),
        "settings": settings.to_dict(),
        "variants": [v.to_dict() for v in variants],
        "definitions": {"tau": TAU_DEFINITION, "speedup": "speed-up: per prompt, tokens/s over AR's tokens/s on "
                        "the same prompt in the same run (methods interleaved), then averaged",
                        "metrics": metric_doc},
        "cost_curve": asdict(cost),
        "auto_tree": journal.setup["auto_tree"],
        "choice": journal.setup.get("choice"),
    }
    paths = write(args.out, result, per_prompt, summary, prof)
    journal.finish()
    for temperature in settings.temperatures:
        print(f"\nT = {temperature:g}\n{speed_table(summary, temperature)}")
    print(f"\nwrote {', '.join(str(p) for p in paths.values())} in {result['duration_s'] / 60:.1f} min "
          f"({result['load']['description']})", file=sys.stderr)
    return paths


def run_name(args: argparse.Namespace, device_type: str) -> str:
    return args.name or f"{device_type}{'-quick' if args.quick else ''}"


def status(args: argparse.Namespace) -> int:
    """Print how far a journaled run has got and its speed-up / τ table so far."""
    from ..target import pick_device
    from .metrics import summarize
    from .progress import read_progress
    from .report import speed_table

    path = args.out / f"{run_name(args, pick_device(args.device).type)}.partial.jsonl"
    if not path.is_file():
        raise GumihoError(f"no run in progress at {path}; finished runs are the .json and .md files in {args.out}")
    progress = read_progress(path, args.data)
    print(f"{path}: {progress.describe()}")
    if not progress.rows.empty:
        summary = summarize(progress.rows)
        for temperature in sorted(summary["temperature"].unique()):
            print(f"\nT = {temperature:g}, conversations done so far\n{speed_table(summary, temperature)}")
    return 0


def run(args: argparse.Namespace, argv: list[str]) -> int:
    from .machine import campaign_paused

    with campaign_paused():  # the machine profile and the runs measure alone (scripts/cpu_campaign.sh waits)
        return measure_and_report(args, argv)


def measure_and_report(args: argparse.Namespace, argv: list[str]) -> int:
    from ..loader import build_engine

    settings = bench_settings(args)
    quiet_libraries()
    drafter_methods = [m for m in DRAFTED if m in {v.split("+")[0] for v in args.methods}]
    folders = drafter_folders(args)
    engine = build_engine(args.model, {m: folders[m] for m in drafter_methods}, device=args.device,
                          threads=args.threads, dtype=args.dtype, lead="gumiho" if "gumiho" in drafter_methods
                          else "ar", progress=args.progress)
    if engine.choice:
        print(f"[auto] {engine.choice.summary('gumiho' if 'gumiho' in drafter_methods else 'ar')}; "
              f"{engine.choice.reason}", file=sys.stderr)
    execute(engine, args, argv, settings)
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    return run_reporting_errors(lambda: status(args) if args.status else run(args, argv))


if __name__ == "__main__":
    sys.exit(main())
