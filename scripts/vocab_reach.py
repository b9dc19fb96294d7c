"""Whether the draft vocabulary limits a drafter: the share of the target's greedy reply tokens that the drafter can
propose at all (its 4,096 kept ids; those or a token already in the prompt or the reply), and τ with the kept ids
against τ with the target's whole vocabulary (the draft head is the target's lm_head restricted to the draft
vocabulary, so the same weights run on all of it), interleaved per prompt (docs/benchmarks.md).

    PYTHONPATH=. .venv/bin/python scripts/vocab_reach.py --prompts 2 --method gumiho
"""

from __future__ import annotations

import argparse
import statistics
from collections import defaultdict

from gumiho.drafters.checkpoint import load_drafter
from gumiho.engine import GenerationConfig
from gumiho.loader import build_engine, shipped_drafter

from scripts.engine_ab import benchmark_prompts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=2, help="first prompts of each set")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--method", default="gumiho", choices=["gumiho", "eagle2"])
    args = parser.parse_args()
    engine = build_engine(threads=2)
    target, kept = engine.target, engine.drafters[args.method]
    whole = load_drafter(str(shipped_drafter(target.name, args.method)), args.method, target.embed_weight,
                         target.model.config)
    whole.vocab_counts = None  # nothing to rank: every id stays
    whole = target.prepare_drafter(whole.use_full_vocab())
    whole.acceptance = kept.acceptance  # the same sizing statistics for both
    vocab = set(kept.draft_vocab.tolist())
    config = GenerationConfig(max_new_tokens=args.tokens, trace=False)
    reach, taus, same = defaultdict(lambda: [0, 0, 0]), defaultdict(list), True
    for name, prompt in benchmark_prompts(args.prompts):
        prompt_ids = target.encode_prompt(prompt)
        reply = engine.generate(prompt, "ar", config, prompt_ids).token_ids
        for label, drafter in (("kept ids", kept), ("whole vocabulary", whole)):
            engine.drafters[args.method] = drafter
            trace = engine.generate(prompt, args.method, config, prompt_ids)
            taus[(name, label)].append((trace.new_tokens - 1) / trace.cycles)
            same = same and trace.token_ids == reply
        engine.drafters[args.method] = kept
        seen, counts = set(prompt_ids), reach[name]
        for token in reply:
            counts[0] += 1
            counts[1] += token in vocab
            counts[2] += token in vocab or token in seen
            seen.add(token)
    print(f"| set | reply tokens | in the {len(vocab):,} kept ids | kept ids or the context | τ kept ids | "
          "τ whole vocabulary |\n|---|---|---|---|---|---|")
    for name, (total, inside, near) in reach.items():
        print(f"| {name} | {total:,} | {inside / total:.3f} | {near / total:.3f} | "
              f"{statistics.mean(taus[(name, 'kept ids')]):.3f} | "
              f"{statistics.mean(taus[(name, 'whole vocabulary')]):.3f} |")
    print("every output equal to AR's:", same)


if __name__ == "__main__":
    main()
