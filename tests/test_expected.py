"""Expected speed-ups that count prompt lookup (expected.py): lookup's cycles replayed on the profile's texts."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gumiho import profile as prof
from gumiho.acceptance import Acceptance
from gumiho.choice import choose
from gumiho.drafters.lookup import lookup_pool
from gumiho.expected import ShortMatches, accepted, replay, speedup
from gumiho.profile import SIZES, ExecPath, MachineProfile, PathCost
from gumiho.prompts import GENERIC_PROMPTS
from gumiho.tree import TreeSettings, build_tree

PROMPT = list(range(100, 120))
# The reply repeats the prompt word for word, then goes on with tokens never seen.
REPEAT = (len(PROMPT), PROMPT + PROMPT + list(range(200, 210)))
FRESH = (len(PROMPT), PROMPT + list(range(300, 330)))
# The reply quotes the prompt four tokens at a time, each quote after a token never seen: at a quote's second token
# the text's last 2 tokens occurred earlier, its last 3 did not (from its third token on, they did).
QUOTES = (len(PROMPT), PROMPT + [t for i in range(4) for t in (400 + i, *PROMPT[5 * i: 5 * i + 4])] + [499])


def cheap_rows(draft_ms: float = 0.1) -> PathCost:
    """A one-token step of 10 ms, each further verified token 0.2 ms more; every drafter's draft `draft_ms`."""
    curve = [10 + 0.2 * (n - 1) for n in SIZES]
    drafts = {m: {k: draft_ms for k in (1, 2, 4)} for m in ("gumiho", "lookup", "recycle")}
    return PathCost(ExecPath("int4"), {kv: curve for kv in prof.KV_LENGTHS}, drafts, head_ms=0.1)


def lookup_tree() -> TreeSettings:
    return replace(TreeSettings.default("lookup", "cpu"), sized=True)


def test_the_accepted_draft_tokens_follow_the_text_from_the_root():
    text = PROMPT + [100, 101, 102]
    pool = lookup_pool(text, lookup_tree())
    tree = build_tree(102, pool, 5)
    assert tree.tokens.tolist() == [102, 103, 104, 105, 106]
    count, hits = accepted(tree, [103, 104, 999])
    assert count == 2 and hits == [True, True, False, False]
    assert accepted(tree, [7]) == (0, [False] * 4)


def test_a_repeated_text_is_mostly_emitted_by_lookup_cycles_and_expected_faster():
    run = replay([REPEAT], lookup_tree(), cheap_rows(), draft_ms=0.1)
    reply = len(REPEAT[1]) - REPEAT[0] - 1  # every reply token after the first (the first cycle's root)
    assert run.lookup_tokens + len(run.other_kv) == reply
    assert run.lookup_tokens >= 15  # the repeat, a few cycles each verifying several of its tokens
    assert len(run.other_kv) >= 9  # the fresh tail: nothing matches there
    assert run.ar_ms == pytest.approx(10.0 * reply)
    assert speedup(run, lambda kv: 10.0) > 1.3


def test_fresh_text_leaves_every_position_to_the_rest_of_the_policy():
    run = replay([FRESH], lookup_tree(), cheap_rows(), draft_ms=0.1)
    assert run.lookup_tokens == 0 and run.lookup_ms == 0.0
    assert run.other_kv == list(range(FRESH[0], len(FRESH[1]) - 1))
    assert speedup(run, lambda kv: 10.0) == pytest.approx(1.0)
    assert speedup(replay([], lookup_tree(), cheap_rows(), 0.1), lambda kv: 10.0) == 1.0


def test_short_matches_take_lookups_tree_where_the_drafters_path_is_slower():
    """The short-match rule as a run applies it (short_match.py): at a 2-token match, lookup's tree where it
    promises more tokens a millisecond than the drafter's path, whose positions are priced at its expected rate."""
    cost, switch = cheap_rows(), replace(lookup_tree(), min_ngram=3, max_ngram=3)

    def with_drafter(ms_per_token: float):
        near = ShortMatches(replace(switch, min_ngram=2), lambda kv: ms_per_token, draft_ms=1.0, size=3)
        return replay([QUOTES], switch, cost, 0.1, near)

    alone = replay([QUOTES], switch, cost, 0.1)  # lookup's cycles at 3-token matches only
    slow, fast = with_drafter(40.0), with_drafter(0.5)
    assert alone.lookup_tokens <= fast.lookup_tokens < slow.lookup_tokens
    reply = len(QUOTES[1]) - QUOTES[0] - 1
    assert slow.lookup_tokens + len(slow.other_kv) == reply
    assert speedup(slow, lambda kv: 40.0) > speedup(alone, lambda kv: 40.0)


def test_the_choice_counts_prompt_lookup_where_the_profile_has_texts():
    """Prompt lookup gets an expectation of its own; a learned drafter's switch adds to its drafted cycles; Token
    Recycling, with no statistics of its own drafts, is expected at its switch's gain, its drafts paid for and none
    accepted, and says it is a lower bound."""
    cost = cheap_rows(draft_ms=1.0)
    profile = MachineProfile(signature={}, model="m", drafters={}, costs=[cost], seconds=1.0, texts=[REPEAT])
    acceptance = {"gumiho": Acceptance({k: [[0], []] for k in (1, 2, 4)})}  # the first draft token right half the time
    methods = ["ar", "gumiho", "lookup", "recycle"]
    plain = choose(replace(profile, texts=[]), methods, "gumiho", acceptance, "cpu").methods
    counted = choose(profile, methods, "gumiho", acceptance, "cpu").methods
    assert plain["lookup"].speedup == 1.0 and "no acceptance statistics" in plain["lookup"].note
    assert counted["lookup"].speedup > 1.3 and counted["lookup"].note == ""
    assert counted["gumiho"].tree == plain["gumiho"].tree  # the tree choice itself is unchanged
    assert counted["gumiho"].speedup > plain["gumiho"].speedup > 1.0
    assert counted["gumiho"].tokens_per_s == pytest.approx(
        plain["gumiho"].tokens_per_s * counted["gumiho"].speedup / plain["gumiho"].speedup)
    assert counted["recycle"].speedup > 1.0 and counted["recycle"].note.startswith("a lower bound")
    assert counted["ar"] == plain["ar"]
    fresh = choose(replace(profile, texts=[FRESH]), methods, "gumiho", acceptance, "cpu").methods
    assert fresh["lookup"].speedup == pytest.approx(1.0)
    assert fresh["gumiho"].speedup == pytest.approx(plain["gumiho"].speedup, rel=0.02)


def test_the_profiles_texts_are_spread_over_the_calibration_prompts(monkeypatch, tmp_path):
    prompts = prof.calibration_prompts()
    first = prompts[: prof.TEXT_PROMPTS]
    assert len(set(prompts)) == len(prompts) == len(prof.read_prompts(prof.CALIBRATION_PROMPTS))
    assert first[0] == GENERIC_PROMPTS[0] and not set(first) <= set(GENERIC_PROMPTS)  # generic and task-shaped
    monkeypatch.setattr(prof, "CALIBRATION_PROMPTS", tmp_path / "missing.jsonl")
    assert prof.calibration_prompts() == list(GENERIC_PROMPTS)


def test_a_stored_text_without_a_reply_is_refused():
    profile = MachineProfile(signature={}, model="m", drafters={}, costs=[cheap_rows()], seconds=1.0, texts=[REPEAT])
    data = profile.to_dict()
    assert MachineProfile.from_dict(data) == profile
    data["texts"] = [[len(PROMPT), PROMPT]]
    with pytest.raises(prof.ProfileError):
        MachineProfile.from_dict(data)
