"""MJSD: the joint acceptance rule, beam drafting, verification through the engine, its trace, perplexity, the CLI."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest
import torch

from gumiho.__main__ import build_parser, main
from gumiho.cli import tree_overrides
from gumiho.engine import Engine, GenerationConfig
from gumiho.errors import GumihoError
from gumiho.mjsd import accepted_length, joint_checks, joint_distribution, mjsd_sampling
from gumiho.perplexity import perplexity
from gumiho.sampling import SamplingConfig, probabilities
from gumiho.trace import GenerationTrace, TraceError
from gumiho.tree import TreeSettings

from .conftest import random_drafter, tiny_target

PROMPT = [1, 5, 2, 7, 3]
GREEDY, SAMPLED = SamplingConfig(), SamplingConfig(temperature=0.8)


def mjsd_engine(seed: int, scale: float = 0.3) -> Engine:
    target = tiny_target(seed)
    return Engine(target, {"mjsd": random_drafter("mjsd", target, seed, scale)})


def mjsd_tree(tau_acc: float = 0.9, gamma: int = 4, beams: int = 8) -> TreeSettings:
    return TreeSettings(top_k=beams, depth=gamma, total_tokens=gamma + 1, tau_acc=tau_acc)


def generate(engine: Engine, tree: TreeSettings | None = None, sampling: SamplingConfig = GREEDY,
             max_new_tokens: int = 30, prompt: list[int] = PROMPT, seed: int = 0) -> GenerationTrace:
    config = GenerationConfig(max_new_tokens=max_new_tokens, sampling=sampling, tree=tree or mjsd_tree(), seed=seed)
    return engine.generate("", "mjsd", config, prompt_ids=prompt)


# --- the acceptance rule ----------------------------------------------------------------------------------------------
def test_the_longest_passing_prefix_is_accepted_even_when_a_shorter_one_fails():
    p, q = [0.5, 0.01, 0.3, 0.001], [0.5, 0.4, 0.3, 0.2]  # ratios 1, 0.025, 1, 0.005
    assert accepted_length(p, q, 0.9) == 3
    assert [c.passed for c in joint_checks(p, q, 0.9)] == [True, False, True, False]


def test_when_every_prefix_fails_nothing_is_accepted():
    assert accepted_length([0.1, 0.01], [0.5, 0.4], 0.9) == 0
    assert accepted_length([], [], 0.5) == 0


def test_threshold_zero_accepts_everything_even_an_impossible_prefix():
    assert accepted_length([0.0, 1e-30, 0.0], [0.9, 0.5, 0.1], 0.0) == 3


def test_the_ratio_is_capped_at_one_and_threshold_one_needs_p_at_least_q():
    checks = joint_checks([0.2, 0.05, 0.04], [0.1, 0.06, 0.04], 1.0)
    assert [c.ratio for c in checks] == pytest.approx([1.0, 0.05 / 0.06, 1.0])
    assert [c.passed for c in checks] == [True, False, True]
    assert [c.length for c in checks] == [1, 2, 3] and checks[0].p == 0.2 and checks[0].q == 0.1
    assert accepted_length([0.2, 0.05], [0.1, 0.06], 1.0) == 1
    assert accepted_length([0.2, 0.05], [0.1, 0.06], 0.8) == 2


# --- beam drafting ----------------------------------------------------------------------------------------------------
@torch.inference_mode()
def test_greedy_beams_that_keep_every_first_token_find_the_best_two_token_chain():
    """With B = V beams after step 1 the frontier holds every first token, so a 2-step beam search is exhaustive,
    and the frontier's normaliser is 1: Q_1 = q(x1), Q_2 = q(x1) q(x2 | x1). The reference runs each chain through
    the draft one position at a time (`advance`), not through the beam's expansion mask."""
    target = tiny_target(seed=3)
    drafter = random_drafter("mjsd", target, seed=3, scale=0.1)
    Engine(target, {"mjsd": drafter})
    vocab = target.vocab_size
    features = target.features(torch.tensor(PROMPT), target.new_cache())
    tokens = torch.tensor(PROMPT[1:] + [4])
    drafter.reset()
    pool = drafter.propose(features, tokens, mjsd_tree(gamma=2, beams=vocab))

    drafter.reset()
    h = drafter.advance(features, tokens)
    stable = drafter.cache.length
    first = torch.log_softmax(drafter.head_logits(h).float(), -1)
    joint = torch.empty(vocab, vocab)
    for x1 in range(vocab):
        out = drafter.advance(h[None], torch.tensor([x1]))
        drafter.cache.truncate(stable)
        joint[x1] = first[x1] + torch.log_softmax(drafter.head_logits(out[None]).float(), -1)[0]
    x1, x2 = divmod(int(joint.flatten().argmax()), vocab)

    assert torch.cat(pool.tokens).tolist() == [x1, x2]
    assert torch.cat(pool.parents).tolist() == [-1, 0] and pool.sources == ["mjsd-1", "mjsd-2"]
    assert torch.cat(pool.scores).tolist() == pytest.approx([float(first[x1]), float(joint[x1, x2])], abs=1e-4)
    assert pool.log_q == pytest.approx([float(first[x1]), float(joint[x1, x2])], abs=1e-4)


def test_sampled_beams_follow_the_run_seed():
    engine = mjsd_engine(seed=1)
    runs = [generate(engine, sampling=SAMPLED, seed=s, max_new_tokens=16) for s in (7, 7, 8)]
    assert runs[0].token_ids == runs[1].token_ids
    assert [[n.token_id for n in s.nodes] for s in runs[0].steps] == [[n.token_id for n in s.nodes] for s in runs[1].steps]
    assert runs[0].token_ids != runs[2].token_ids


# --- verification through the engine ----------------------------------------------------------------------------------
@pytest.mark.parametrize("sampling", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_threshold_zero_accepts_the_whole_draft_every_cycle(sampling):
    engine = mjsd_engine(seed=2)
    trace = generate(engine, mjsd_tree(tau_acc=0.0), sampling, max_new_tokens=31)
    assert all(s.accept_length == 4 and len(s.emitted) == 5 for s in trace.steps)
    assert trace.cycles == 6 and trace.tau == 5.0 and trace.new_tokens == 31
    assert all(c.passed for s in trace.steps for c in s.joint)


@pytest.mark.parametrize("sampling", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_threshold_one_accepts_the_longest_prefix_whose_p_reaches_q(sampling):
    passed = failed = accepted = 0
    for seed in range(3):
        trace = generate(mjsd_engine(seed, scale=0.05), mjsd_tree(tau_acc=1.0), sampling, max_new_tokens=30)
        for step in trace.steps:
            assert [c.length for c in step.joint] == list(range(1, step.tree_size))
            for c in step.joint:
                assert c.ratio == pytest.approx(min(1.0, c.p / c.q)) and c.passed == (c.p >= c.q)
            assert step.accept_length == max((c.length for c in step.joint if c.p >= c.q), default=0)
            assert step.accepted_nodes == list(range(step.accept_length + 1))
            passed += sum(c.passed for c in step.joint)
            failed += sum(not c.passed for c in step.joint)
            accepted += step.accept_length
    assert passed and failed and accepted  # both outcomes occurred, and drafts were accepted


@pytest.mark.parametrize("sampling", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_recorded_joint_probabilities_are_the_targets(sampling):
    """P_i recomputed with a plain sequential forward over the text so far and the draft; in the greedy variant
    from the softmax at T = 1, with the target's argmax after the accepted prefix as the bonus token."""
    engine = mjsd_engine(seed=5, scale=0.05)
    target = engine.target
    trace = generate(engine, mjsd_tree(tau_acc=0.5), sampling, max_new_tokens=30)
    distribution = joint_distribution(mjsd_sampling(sampling))
    context = PROMPT + [trace.first_token]
    for step in trace.steps:
        draft = [n.token_id for n in step.nodes[1:]]
        logits = target.logits(target.features(torch.tensor(context + draft), target.new_cache()))[len(context) - 1 :]
        probs = probabilities(logits[: len(draft)], distribution).double()
        expected = probs[torch.arange(len(draft)), draft].cumprod(0).tolist()
        assert [c.p for c in step.joint] == pytest.approx(expected, rel=1e-4, abs=1e-12)
        if sampling.greedy:
            assert step.bonus_token == int(logits[step.accept_length].argmax())
            assert step.joint[0].q == pytest.approx(math.exp(step.nodes[1].score), rel=1e-5)  # the root's mass is 1
        context += step.emitted


def test_the_trace_tree_is_the_drafted_chain():
    trace = generate(mjsd_engine(seed=3), mjsd_tree(tau_acc=0.3))
    for step in trace.steps:
        assert [n.source for n in step.nodes] == ["root", "mjsd-1", "mjsd-2", "mjsd-3", "mjsd-4"]
        assert [n.parent for n in step.nodes] == [-1, 0, 1, 2, 3] and step.tree_depth == 4
        assert len(step.paths) == 1 and step.paths[0].accepted == step.accept_length
        assert step.accepted_tokens == [n.token_id for n in step.nodes[1 : step.accept_length + 1]]
        assert step.emitted == step.accepted_tokens + [step.bonus_token] or step is trace.steps[-1]
    assert [trace.first_token] + [t for s in trace.steps for t in s.emitted] == trace.token_ids


@pytest.mark.parametrize("budget", [1, 2, 7, 23])
@pytest.mark.parametrize("sampling", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_max_new_tokens_is_exact(budget, sampling):
    trace = generate(mjsd_engine(seed=1), mjsd_tree(tau_acc=0.0), sampling, max_new_tokens=budget)
    assert trace.new_tokens == budget and trace.finish_reason == "length"


def test_an_end_token_stops_the_run_and_is_never_drafted():
    engine = mjsd_engine(seed=0)
    free = generate(engine, max_new_tokens=40)
    eos = [t for i, t in enumerate(free.token_ids) if t not in free.token_ids[:i]][-1]  # first seen at index 13
    engine.target.eos_ids = {eos}
    trace = generate(engine, max_new_tokens=40)
    assert trace.finish_reason == "eos" and trace.token_ids[-1] == eos and eos not in trace.token_ids[:-1]
    assert all(n.token_id != eos for s in trace.steps for n in s.nodes[1:])


def test_context_limit_cuts_the_chain_without_overflow():
    engine = mjsd_engine(seed=4)
    limit = engine.target.max_context
    prompt = (PROMPT * 200)[: limit - 12]
    trace = generate(engine, mjsd_tree(tau_acc=0.0), max_new_tokens=50, prompt=prompt)
    assert trace.finish_reason == "context" and len(prompt) + trace.new_tokens == limit + 1
    assert [s.tree_size for s in trace.steps] == [5, 5, 2] and len(trace.steps[-1].joint) == 1


# --- settings and trace -----------------------------------------------------------------------------------------------
def test_the_trace_marks_the_run_approximate_and_round_trips():
    greedy = generate(mjsd_engine(seed=6), mjsd_tree(tau_acc=0.7), max_new_tokens=12)
    assert greedy.settings.tree["tau_acc"] == 0.7 and "greedy variant" in greedy.settings.approximate
    sampled = generate(mjsd_engine(seed=6), sampling=SAMPLED, max_new_tokens=12)
    assert sampled.settings.sampling == {"temperature": 0.8, "top_p": 0.9, "top_k": 20}  # the paper's filters
    assert "tau_acc 0.9" in sampled.settings.approximate and "greedy" not in sampled.settings.approximate
    for trace in (greedy, sampled):
        again = GenerationTrace.from_json(trace.to_json())
        assert again == trace and again.steps[0].joint == trace.steps[0].joint


def test_traces_without_the_mjsd_fields_still_load_and_bad_checks_are_refused():
    data = json.loads(generate(mjsd_engine(seed=6), max_new_tokens=8).to_json())
    old = json.loads(json.dumps(data))
    del old["settings"]["approximate"]
    for step in old["steps"]:
        del step["joint"]
    loaded = GenerationTrace.from_dict(old)
    assert loaded.settings.approximate == "" and all(s.joint == [] for s in loaded.steps)
    data["steps"][0]["joint"][0]["length"] = 3
    with pytest.raises(TraceError, match="joint check 1"):
        GenerationTrace.from_dict(data)


def test_run_sampling_is_narrowed_to_the_papers_filters():
    assert mjsd_sampling(GREEDY) == GREEDY
    assert mjsd_sampling(SamplingConfig(temperature=1.0)) == SamplingConfig(temperature=1.0, top_k=20, top_p=0.9)
    assert mjsd_sampling(SamplingConfig(temperature=1.0, top_k=5, top_p=0.5)) == SamplingConfig(1.0, 0.5, 5)
    assert joint_distribution(GREEDY) == SamplingConfig(temperature=1.0)


@pytest.mark.parametrize("tree,message", [
    (mjsd_tree(tau_acc=1.5), r"tau-acc must be in \[0, 1\], got 1.5"),
    (mjsd_tree(tau_acc=-0.1), r"tau-acc must be in \[0, 1\]"),
    (replace(mjsd_tree(), tau_acc=None), r"tau-acc must be in \[0, 1\], got None"),
    (replace(mjsd_tree(), total_tokens=4), "total-tokens must be gamma \\+ 1 = 5"),
])
def test_bad_mjsd_settings_are_refused(tree, message):
    with pytest.raises(GumihoError, match=message):
        tree.validate("mjsd")
    with pytest.raises(GumihoError, match=message):
        mjsd_engine(seed=0).run("", "mjsd", GenerationConfig(tree=tree), prompt_ids=PROMPT)


def test_tau_acc_belongs_to_mjsd_only_and_the_default_is_the_papers():
    assert TreeSettings.default("mjsd", "cpu") == TreeSettings.default("mjsd", "cuda") == mjsd_tree(0.9, 4, 8)
    with pytest.raises(GumihoError, match="tau-acc is an MJSD option"):
        replace(TreeSettings.default("eagle2"), tau_acc=0.5).validate("eagle2")


# --- perplexity -------------------------------------------------------------------------------------------------------
def test_perplexity_matches_a_direct_computation():
    target = tiny_target(seed=6)
    prompt, output = [1, 2, 3, 4, 5], [6, 7, 8, 9, 3]
    with torch.no_grad():
        logits = target.model(torch.tensor([prompt + output])).logits[0].float()
    logp = torch.log_softmax(logits, -1)
    nll = -sum(float(logp[len(prompt) - 1 + i, t]) for i, t in enumerate(output)) / len(output)
    assert perplexity(target, prompt, output) == pytest.approx(math.exp(nll), rel=1e-4)
    with pytest.raises(GumihoError, match="at least one output token"):
        perplexity(target, prompt, [])


# --- command line -----------------------------------------------------------------------------------------------------
def run_cli(capsys, *args: str) -> tuple[int, str, str]:
    try:
        code = main(["generate", "--prompt", "hi", *args])
    except SystemExit as exc:  # argparse's usage errors
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("args,message", [
    (["--method", "mjsd", "--tau-acc", "1.5"], "argument --tau-acc: must be in [0, 1]"),
    (["--method", "mjsd", "--tau-acc", "high"], "expected a number, got 'high'"),
    (["--method", "mjsd", "--gamma", "0"], "argument --gamma: must be >= 1"),
    (["--method", "eagle2", "--tau-acc", "0.5"], "--gamma, --beams and --tau-acc are MJSD options"),
    (["--method", "gumiho", "--beams", "4"], "--gamma, --beams and --tau-acc are MJSD options"),
])
def test_bad_mjsd_options_fail_fast_with_one_line(capsys, args, message):
    code, out, err = run_cli(capsys, *args)
    assert code == 2 and out == ""
    assert err.strip().splitlines() == [err.strip()] and message in err


def test_mjsd_options_become_its_tree():
    args = build_parser().parse_args(["generate", "--method", "mjsd", "--gamma", "6", "--beams", "3",
                                      "--tau-acc", "0.5"])
    assert TreeSettings.resolve("mjsd", overrides=tree_overrides(args)) == mjsd_tree(0.5, 6, 3)
    args = build_parser().parse_args(["generate", "--method", "mjsd"])
    assert TreeSettings.resolve("mjsd", overrides=tree_overrides(args)) == TreeSettings.default("mjsd")
