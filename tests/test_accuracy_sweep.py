"""scripts/accuracy_sweep.py's drafter wrapper: with q = 1 every drafted best first token is the target's next
token, siblings stay distinct, and speculation still equals AR (the replaced tokens are only proposals)."""

from __future__ import annotations

import torch

from gumiho.engine import GenerationConfig
from gumiho.tree import TreeSettings
from scripts.accuracy_sweep import FirstTokenFix

from .conftest import tiny_engine


def test_fixing_every_wrong_first_token_makes_the_drafts_right_and_output_stays_ar():
    engine = tiny_engine(seed=3)
    drafter = engine.drafters["gumiho"]
    fix = FirstTokenFix(drafter)
    drafter.propose = fix
    ids = torch.randint(0, 16, (7,), generator=torch.Generator().manual_seed(3)).tolist()
    two_tokens = TreeSettings(top_k=3, depth=2, total_tokens=2, mlptopk=2, pruning=2)  # one draft token a cycle
    config = GenerationConfig(max_new_tokens=24, tree=two_tokens)
    reply = engine.generate("", "ar", GenerationConfig(max_new_tokens=24), prompt_ids=ids).token_ids
    fix.sequence = ids + reply
    proposed = []
    original = fix.propose
    fix.propose = lambda *args: proposed.append(original(*args)) or proposed[-1]

    fix.q = 0.0
    shipped = engine.generate("", "gumiho", config, prompt_ids=ids)
    assert shipped.token_ids == reply and fix.right < fix.drafted  # random drafts: some first tokens are wrong

    fix.q, fix.right, fix.drafted = 1.0, 0, 0
    fixed = engine.generate("", "gumiho", config, prompt_ids=ids)
    assert fixed.token_ids == reply
    assert fix.drafted > 0 and fix.right == fix.drafted
    assert all(len(set(pool.tokens[0].tolist())) == pool.tokens[0].numel() for pool in proposed)
    assert fixed.cycles < shipped.cycles  # every verified draft token accepted
