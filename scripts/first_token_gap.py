"""How often a drafter's first draft token is the target's, per benchmark set: teacher-forced on the target's own
greedy replies (depth-1 chain accuracy, as `gumiho.train eval` measures on held-out ShareGPT replies), and in the
decoding loop at the automatic tree, prompt lookup's switch off (the share of drafting cycles whose first draft
token was accepted). One process, the engine's automatic path (int4 on a CPU) (docs/training.md, "Task-shaped data"). Evaluation only: nothing here trains.

    PYTHONPATH=. .venv/bin/python scripts/first_token_gap.py --prompts 2 --drafter assets/drafters/smollm2-135m-gumiho
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from dataclasses import replace

import torch

from gumiho.drafters import Drafter
from gumiho.engine import Engine, GenerationConfig
from gumiho.loader import build_engine, choose_trees, load_drafters
from gumiho.target import Target
from gumiho.train.evaluate import chain_predictions
from gumiho.train.features import Sequence

from scripts.engine_ab import benchmark_prompts


def first_token_hits(drafter: Drafter, target: Target, prompt_ids: list[int], reply: list[int]) -> tuple[int, int]:
    """How often `drafter`'s first draft token is the target's next one, teacher-forced on `reply` (depth-1 chain
    accuracy, as `gumiho.train eval` counts it): hits and counted positions."""
    ids = torch.tensor(prompt_ids + reply)
    mask = torch.zeros(len(ids), dtype=torch.bool)
    mask[len(prompt_ids):] = True
    features = target.features(ids, target.new_cache(), prefill=True).float().cpu()
    predicted, labels, counted = chain_predictions(drafter, target, Sequence(ids, mask, features), 3)
    hits = (predicted[:, 0] == labels[:, 0])[counted]
    return int(hits.sum()), hits.numel()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=2, help="first prompts of each set")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--drafter", action="append", required=True, help="drafter folder (repeatable)")
    args = parser.parse_args()
    target = build_engine(drafters={}, threads=2).target
    config = GenerationConfig(max_new_tokens=args.tokens, trace=False)
    print("| drafter | set | teacher-forced depth 1 | in the loop |\n|---|---|---|---|")
    for folder in args.drafter:
        scoring = Drafter.from_pretrained(folder)  # the module path, as training's evaluation runs it
        scoring.attach(target.embed_weight.float(), target.head_weight.float())
        engine = Engine(target)
        for method, (drafter, name) in load_drafters(target, target.name, {scoring.kind: folder}).items():
            engine.add_drafter(method, drafter, name)
        choose_trees(engine, lead=scoring.kind, measure=False)
        tree = replace(engine.default_tree(scoring.kind), lookup_merge=0)
        counts = defaultdict(lambda: [0, 0, 0, 0])  # teacher-forced hits, origins; loop hits, drafting cycles
        for name, prompt in benchmark_prompts(args.prompts):
            prompt_ids = target.encode_prompt(prompt)
            reply = engine.generate("", "ar", config, prompt_ids).token_ids
            hits, origins = first_token_hits(scoring, target, prompt_ids, reply)
            run = engine.generate("", scoring.kind, GenerationConfig(max_new_tokens=args.tokens, tree=tree),
                                  prompt_ids)  # traced: a cycle's tree size is recorded with its nodes
            drafting = [c for c in run.steps if c.tree_size > 1]
            tally = counts[name]
            tally[0] += hits
            tally[1] += origins
            tally[2] += sum(1 for c in drafting if c.accepted_tokens)
            tally[3] += len(drafting)
        for name, (hit, origins, accepted, drafted) in counts.items():
            print(f"| {folder} | {name} | {hit / max(origins, 1):.3f} ({origins}) | "
                  f"{accepted / max(drafted, 1):.3f} ({drafted}) |")
        total = [sum(t[i] for t in counts.values()) for i in range(4)]
        print(f"| {folder} | all | {total[0] / max(total[1], 1):.3f} | {total[2] / max(total[3], 1):.3f} |")


if __name__ == "__main__":
    main()
