"""Is a drafter's held-out accuracy inflated by near-duplicates of its training prompts? Teacher-forced depth-1
accuracy (as `gumiho.train eval` measures it) on held-out ShareGPT first turns, by how much of each prompt's word
4-grams its nearest training-side first turn contains, and on the benchmark sets' first prompts for reference
(docs/training.md, "Near-duplicates in the held-out split"). Evaluation only: nothing here trains.

    PYTHONPATH=. .venv/bin/python scripts/heldout_overlap.py --prompts 80 --drafter assets/drafters/smollm2-135m-gumiho
"""

from __future__ import annotations

import argparse
import random
import re
from collections import Counter, defaultdict

from gumiho.drafters import Drafter
from gumiho.engine import Engine, GenerationConfig
from gumiho.loader import build_engine
from gumiho.target import Target
from gumiho.train.data import load_conversations, split

from scripts.engine_ab import benchmark_prompts
from scripts.first_token_gap import first_token_hits

GRAM = 4
BUCKETS = ((0.0, 0.2), (0.2, 0.5), (0.5, 0.8), (0.8, 1.01))


def grams(text: str) -> set[tuple[str, ...]]:
    words = re.findall(r"\w+", text.casefold())
    return {tuple(words[i:i + GRAM]) for i in range(len(words) - GRAM + 1)} or ({tuple(words)} if words else set())


def first_turn(conversation) -> str:
    return next((m["content"] for m in conversation.messages if m["role"] == "user"), "")


def depth1(engine: Engine, drafter: Drafter, target: Target, prompt: str, tokens: int) -> tuple[int, int]:
    """Hits and counted positions of the drafter's first draft token, teacher-forced on the target's greedy reply."""
    prompt_ids = target.encode_prompt(prompt)
    reply = engine.generate("", "ar", GenerationConfig(max_new_tokens=tokens, trace=False), prompt_ids).token_ids
    return first_token_hits(drafter, target, prompt_ids, reply)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=80, help="held-out first turns (seeded choice)")
    parser.add_argument("--bench", type=int, default=2, help="first prompts of each benchmark set")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--drafter", default="assets/drafters/smollm2-135m-gumiho")
    args = parser.parse_args()
    train, heldout = split(load_conversations())
    index: dict[tuple[str, ...], set[int]] = defaultdict(set)
    for i, conversation in enumerate(train):
        for gram in grams(first_turn(conversation)):
            index[gram].add(i)

    def containment(prompt: str) -> float:
        own = grams(prompt)
        hits = Counter(i for gram in own for i in index.get(gram, ()))
        return hits.most_common(1)[0][1] / len(own) if hits else 0.0

    engine = build_engine(drafters={}, threads=2)
    target = engine.target
    drafter = Drafter.from_pretrained(args.drafter)  # the module path, as training's evaluation runs it
    drafter.attach(target.embed_weight.float(), target.head_weight.float())
    candidates = [first_turn(c) for c in heldout if "_" not in c.id or c.id.endswith("_0")]
    random.Random(0).shuffle(candidates)
    chosen = [p for p in candidates if 3 <= len(target.encode_prompt(p)) <= 400][: args.prompts]
    by_bucket = defaultdict(lambda: [0, 0, 0])  # prompts, hits, positions
    for prompt in chosen:
        share = containment(prompt)
        hits, counted = depth1(engine, drafter, target, prompt, args.tokens)
        bucket = next(b for b in BUCKETS if b[0] <= share < b[1])
        for i, value in enumerate((1, hits, counted)):
            by_bucket[bucket][i] += value
    print(f"{len(train):,} training-side first turns; {len(chosen)} held-out prompts\n")
    print("| nearest training prompt holds of its 4-grams | prompts | depth-1 accuracy |\n|---|---|---|")
    for bucket in BUCKETS:
        prompts, hits, counted = by_bucket[bucket]
        print(f"| {bucket[0]:.1f}-{min(bucket[1], 1.0):.1f} | {prompts} | {hits / max(counted, 1):.3f} |")
    sets = defaultdict(lambda: [0, 0])
    for name, prompt in benchmark_prompts(args.bench):
        hits, counted = depth1(engine, drafter, target, prompt, args.tokens)
        sets[name][0] += hits
        sets[name][1] += counted
    print("| benchmark sets | " + ", ".join(f"{n} {h / c:.3f}" for n, (h, c) in sets.items()) + " | "
          f"{sum(h for h, _ in sets.values()) / sum(c for _, c in sets.values()):.3f} |")


if __name__ == "__main__":
    main()
