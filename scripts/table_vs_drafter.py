"""How often a drafter's first draft token, and Token Recycling's table, guess the target's next token: teacher-forced
on the target's own greedy replies to the benchmark sets' first prompts (int4 path on a CPU). The table's guess at a
root is the target's top-1 after that token's last earlier occurrence (in the prompt's last 512 positions or the
reply so far), as recycling's table holds it; "table only" counts the positions where the table is right and the
drafter's first token wrong, "not top 2" those where the drafter's second choice is wrong too: what merging the
table's entry into the drafter's tree could add (docs/benchmarks.md). Evaluation only: nothing here trains.

    PYTHONPATH=. .venv/bin/python scripts/table_vs_drafter.py --prompts 2
"""

from __future__ import annotations

import argparse
from collections import Counter, defaultdict

import torch

from gumiho.drafters import Drafter
from gumiho.drafters.layers import KVCache
from gumiho.drafters.recycle import PROMPT_ROWS
from gumiho.engine import GenerationConfig
from gumiho.loader import build_engine

from scripts.engine_ab import benchmark_prompts


def table_guesses(ids: list[int], prompt_length: int, top1: list[int]) -> list[int]:
    """At each reply root (positions prompt_length - 1 .. end - 1), the target's top-1 after that token's last earlier
    occurrence (-1: none yet); `top1[j]` is the target's top-1 after position j."""
    last = {ids[j]: j for j in range(max(0, prompt_length - PROMPT_ROWS), prompt_length - 1)}
    guesses = []
    for i in range(prompt_length - 1, len(ids) - 1):
        j = last.get(ids[i])
        guesses.append(top1[j] if j is not None else -1)
        last[ids[i]] = i
    return guesses


@torch.inference_mode()
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=2, help="first prompts of each set")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--drafter", default="assets/drafters/smollm2-135m-gumiho")
    args = parser.parse_args()
    engine = build_engine(drafters={}, threads=2)
    target = engine.target
    drafter = Drafter.from_pretrained(args.drafter)
    drafter.attach(target.embed_weight.float(), target.head_weight.float())
    counts: dict[str, Counter] = defaultdict(Counter)
    for name, prompt in benchmark_prompts(args.prompts):
        prompt_ids = target.encode_prompt(prompt)
        ids = prompt_ids + engine.generate("", "ar", GenerationConfig(max_new_tokens=args.tokens, trace=False),
                                           prompt_ids).token_ids
        tensor = torch.tensor(ids)
        features = target.features(tensor, target.new_cache(), prefill=True).float()
        top1 = torch.cat([target.logits(features[i:i + 64]).float().argmax(-1)
                          for i in range(0, len(ids), 64)]).tolist()
        layers = drafter.transformer  # the drafter's first step at every root, teacher-forced (its training form)
        hidden = layers(layers.fuse(drafter.embed(tensor[1:]), features[:-1])[None], torch.arange(len(ids) - 1), None,
                        KVCache(drafter.config.num_layers))[0]
        _, best = drafter.top_tokens(hidden, 2)
        roots = range(len(prompt_ids) - 1, len(ids) - 1)  # hidden row i - 1 drafts the token after root i
        table = table_guesses(ids, len(prompt_ids), top1)
        tally = counts[name]
        for root, guess in zip(roots, table):
            label = top1[root]
            first, second = best[root - 1].tolist()
            tally["positions"] += 1
            tally["drafter"] += first == label
            tally["table"] += guess == label
            tally["either"] += label in (first, guess)
            tally["table only"] += guess == label != first
            tally["not top 2"] += guess == label and label not in (first, second)
    columns = ["drafter", "table", "either", "table only", "not top 2"]
    print(f"| set | positions | {' | '.join(columns)} |\n|---|---|{'---|' * len(columns)}")
    for name, tally in [*counts.items(), ("all", sum(counts.values(), Counter()))]:
        print(f"| {name} | {tally['positions']} | "
              + " | ".join(f"{tally[c] / max(tally['positions'], 1):.3f}" for c in columns) + " |")


if __name__ == "__main__":
    main()
