"""The machine profile (measured, cached by machine signature, never trusted when foreign or corrupt) and the
automatic choice made from it and a drafter's acceptance statistics."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from gumiho import kernels
from gumiho import profile as prof
from gumiho.acceptance import Acceptance
from gumiho.choice import (CHEAPER_WITHIN, Choice, Unmeasured, best_tree, choose, rate_bound,
                           rated_size)
from gumiho.loader import choose_measured, choose_trees
from gumiho.engine import GenerationConfig
from gumiho.errors import GumihoError
from gumiho.profile import SIZES, ExecPath, MachineProfile, PathCost, target_for
from gumiho.static_tree import layout
from gumiho.target import parse_dtype, pick_device
from gumiho.trace import GenerationTrace
from gumiho.tree import TreeSettings
from gumiho.verify import ALL_ROWS

from .conftest import random_drafter, tiny_engine, tiny_target, use_cache


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    use_cache(monkeypatch, tmp_path)
    return tmp_path


def tiny_setup():
    target = tiny_target(seed=1, vocab=32)
    drafters = {m: random_drafter(m, target, seed=1) for m in ("eagle2", "gumiho")}
    return target, drafters


def test_a_curve_is_read_from_each_sizes_difference_to_the_one_token_step_timed_before_it():
    """Each repeat's sizes run back to back; between repeats the machine drifts (here by up to 0.9 ms). T(1) is its
    lowest time, and T(n) adds the median over repeats of T(n) minus that repeat's T(1)."""
    drift, extra = [0.0, 0.9, 0.4], {1: 0.0, 2: 0.3, 3: 0.5, 4: 0.7}
    samples = {n: [4.0 + d + extra[n] for d in drift] if n in extra else [] for n in SIZES}
    samples[2][1] += 0.5  # one pair disturbed: the median ignores it
    warm = {n: 100.0 + n for n in SIZES}  # repeat 0's times, for sizes not timed again
    curve = prof.paired_curve(samples, warm)
    assert curve[:4] == pytest.approx([4.0, 4.3, 4.5, 4.7])
    assert curve[4:] == [warm[n] for n in SIZES[4:]]
    assert prof.paired_curve({n: [] for n in SIZES}, warm) == [warm[n] for n in SIZES]


def test_measure_times_every_candidate_path_size_and_top_k():
    target, drafters = tiny_setup()
    profile = prof.measure(target, drafters, repeats=1, top_ks=(2, 3), progress=False, screen=False)
    assert [c.path for c in profile.costs] == prof.candidate_paths(target.device)
    for cost in profile.costs:
        assert sorted(cost.verify_ms) == sorted(prof.KV_LENGTHS)
        assert all(len(v) == len(SIZES) and min(v) > 0 for v in cost.verify_ms.values())
        assert sorted(cost.draft_ms) == ["eagle2", "gumiho"]
        assert all(sorted(per) == [2, 3] and min(per.values()) > 0 for per in cost.draft_ms.values())
        for method in ("eagle2", "gumiho"):  # each size too small for the widest tree's depth has its own draft
            small = cost.small_draft_ms[method]
            assert sorted(small) == [2, 3]
            assert all(list(small[k]) == list(prof.small_sizes(method, k)) for k in small)
            assert cost.draft_at(method, 2, 2) == small[2][2] and cost.draft_at(method, 2, 64) == cost.draft_ms[method][2]
    assert prof.small_sizes("gumiho", 1) == (2, 3, 4, 6), "depth 6: the profiled sizes up to 7 stop early"
    assert prof.small_sizes("lookup", 1) == ()
    assert profile.signature == prof.signature(target.device)
    assert 0 < len(profile.texts) <= prof.TEXT_PROMPTS  # the fastest path's greedy replies to calibration prompts
    assert all(0 < length < len(ids) <= length + prof.TEXT_TOKENS for length, ids in profile.texts)
    assert MachineProfile.from_dict(json.loads(json.dumps(profile.to_dict()))) == profile


def test_a_static_trees_small_sizes_are_those_its_layout_keeps_shallower():
    """A static tree of n tokens is its first n - 1 paths: EAGLE drafts, and Medusa runs heads, only that deep, so
    the profile times those drafts on their own rather than charging the widest tree's."""
    for method in ("eagle1", "medusa", "hydra"):
        widest = prof.widest_tree(method, 4)
        sizes = prof.small_sizes(method, widest.top_k)
        assert sizes and sizes[0] == 2 and max(sizes) < widest.total_tokens
        depth = layout(method, widest.depth, widest.total_tokens - 1).depth
        assert all(layout(method, widest.depth, n - 1).depth < depth for n in sizes)
        assert all(layout(method, widest.depth, n - 1).depth == depth
                   for n in SIZES if max(sizes) < n < widest.total_tokens)
    assert prof.small_sizes("eagle1", 4)[0] == 2 and layout("eagle1", 5, 1).depth == 1


def test_a_draft_is_timed_after_a_target_forward_as_in_a_cycle(monkeypatch):
    """The draft timer's set-up drafts once over the prefix (warming the drafter's weights); `before` (the
    profile's one-token target forward) then runs, untimed, between it and the timed draft."""
    target, drafters = tiny_setup()
    drafter, events = prof.drafter_for(drafters["gumiho"], target), []
    ids = torch.randint(32, (260,), generator=torch.Generator().manual_seed(0))
    features = target.features(ids, target.new_cache())
    clock = iter(range(1000))
    with monkeypatch.context() as patch:
        patch.setattr(drafter, "propose", lambda *a, real=drafter.propose: events.append("propose") or real(*a))
        patch.setattr(prof.time, "perf_counter", lambda: events.append("clock") or next(clock))
        timer = prof.DraftTimer(target, drafter, "gumiho", ids, features, before=lambda: events.append("forward"))
        assert timer(2, 3) == 1e3  # one tick of the stand-in clock: only the draft is timed
    assert events == ["propose", "forward", "clock", "propose", "clock"]
    profile = prof.measure(target, drafters, repeats=1, top_ks=(2,), progress=False, screen=False)
    calls = []
    monkeypatch.setattr(prof.VerifyTimer, "__call__", lambda self, n: calls.append(n) or 1.0)
    prof.measure(target, drafters, repeats=1, top_ks=(2,), progress=False, screen=False)
    drafts = sum(len(per) + sum(len(s) for s in profile.costs[0].small_draft_ms.get(m, {}).values())
                 for m, per in profile.costs[0].draft_ms.items())
    verifications = len(prof.KV_LENGTHS) * len(SIZES)
    # per path and repeat (the warm-up's included): the screen's one-token step after an untimed one at each KV
    # length; each size's verification, an untimed one-token forward before each KV length's sizes, and one before
    # each draft
    screen = 2 * len(profile.costs) * 2 * len(prof.KV_LENGTHS)
    assert calls.count(1) == screen + 2 * len(profile.costs) * (2 * len(prof.KV_LENGTHS) + drafts)
    assert len(calls) == screen + 2 * len(profile.costs) * (verifications + len(prof.KV_LENGTHS) + drafts)


def stepped_timer(steps: dict[str, float]):
    """A stand-in for `VerifyTimer.__call__`: a path's T(n) is its dtype's one-token step plus 0.5 ms a token."""
    return lambda self, n: steps[self.target.precision] + 0.5 * (n - 1)


def test_a_path_whose_one_token_step_cannot_win_is_screened_not_timed_in_full(monkeypatch):
    """Every path's one-token step is timed; the fastest is timed in full, and so is a path near it, while one whose
    step is 5x the fastest's cannot win for any method, even SCREEN_SLACK times faster and drafting for free: it keeps
    its one-token step only (at every size: a lower bound), and no draft of it is timed."""
    target, drafters = tiny_setup()
    for drafter in drafters.values():
        drafter.acceptance = deep_acceptance()
    paths = [ExecPath("float32"), ExecPath("bfloat16"), ExecPath("float16")]
    monkeypatch.setattr(prof.VerifyTimer, "__call__", stepped_timer({"float32": 10.0, "bfloat16": 50.0,
                                                                     "float16": 10.5}))
    drafted = []
    monkeypatch.setattr(prof.DraftTimer, "__call__", lambda self, k, n=None: drafted.append(self.target.precision)
                        or 1.0)
    shown = []
    profile = prof.measure(target, drafters, paths=paths, repeats=1, top_ks=(3, 4), progress=False,
                           on_progress=shown.append)
    assert shown == sorted(shown) and shown[-1] == 1.0 and len(shown) <= 10  # tenths, over a total that grew
    fp32, bf16, fp16 = profile.costs
    assert [c.path for c in profile.costs] == paths
    assert not fp32.screened and not fp16.screened and bf16.screened
    assert set(drafted) == {"float32", "float16"}
    assert bf16.verify_ms == {kv: [50.0] * len(SIZES) for kv in prof.KV_LENGTHS} and not bf16.draft_ms
    assert fp32.draft_ms["gumiho"] == {3: 1.0, 4: 1.0} and fp32.verify_ms[256][:3] == [10.0, 10.5, 11.0]
    assert MachineProfile.from_dict(json.loads(json.dumps(profile.to_dict()))) == profile
    acc = {m: d.acceptance for m, d in drafters.items()}
    choice = choose(profile, ["ar", "eagle2", "gumiho"], "gumiho", acc, "cpu")
    assert choice.path.dtype == "float32" and "bf16 lean under" in choice.reason
    # without the screen every path is timed in full
    unscreened = prof.measure(target, drafters, paths=paths, repeats=1, top_ks=(3, 4), progress=False, screen=False)
    assert not any(c.screened for c in unscreened.costs)


def test_a_screened_paths_bound_is_never_below_what_its_full_timing_gives():
    """`rate_bound` on a path's one-token steps alone is at least `best_tree`'s expectation from its full timing,
    for every method, tree family and fixed size: a path ruled out on its screen would have lost in full."""
    acc = deep_acceptance()
    for cost in flat_profile().costs:
        screened = PathCost(cost.path, {kv: [curve[0]] * len(SIZES) for kv, curve in cost.verify_ms.items()},
                            screened=True)
        for method in ("eagle2", "gumiho"):
            base = TreeSettings.default(method, "cpu")
            for top_k, total in [(None, None), (4, None), (None, 12), (6, 24)]:
                full = best_tree(cost, method, base, acc, top_k, total).tokens_per_s
                assert rate_bound(screened, method, acc, top_k, total) >= full
                assert rate_bound(cost, method, acc, top_k, total) >= full
        assert rate_bound(screened, "ar", None) == pytest.approx(1e3 / cost.verify_at(1, 512))


def test_a_choice_that_needs_a_screened_path_times_it_in_full_first(cache_dir, monkeypatch):
    """A fixed dtype whose path was screened, or a screened path whose bound reaches the best timed one (a fixed
    large tree), raises Unmeasured; `choose_measured` then times that path in full, caches it in the profile's
    place, and chooses; without measuring (`choose_trees(measure=False)`) no choice is made."""
    target, drafters = tiny_setup()
    for drafter in drafters.values():
        drafter.acceptance = deep_acceptance()
    acc = {m: d.acceptance for m, d in drafters.items()}
    paths = prof.candidate_paths(target.device)
    steps = {p.dtype: 10.0 if p.dtype == "float32" else 60.0 for p in paths}
    monkeypatch.setattr(prof.VerifyTimer, "__call__", stepped_timer(steps))
    monkeypatch.setattr(prof.DraftTimer, "__call__", lambda self, k, n=None: 1.0)
    profile = prof.load_or_measure(target, drafters, progress=False)
    assert [c.screened for c in profile.costs] == [p.dtype != "float32" for p in paths]
    assert choose(profile, ["ar", "gumiho"], "gumiho", acc, "cpu").path.dtype == "float32"
    with pytest.raises(Unmeasured) as missing:
        choose(profile, ["ar", "gumiho"], "gumiho", acc, "cpu", dtype="bfloat16")
    assert {p.dtype for p in missing.value.paths} == {"bfloat16"}
    engine = tiny_engine(seed=2, vocab=32)
    engine.target = target_for(target, ExecPath("bfloat16"))
    for method, drafter in drafters.items():
        engine.drafters[method] = drafter
    assert not choose_trees(engine, measure=False)
    choice = choose_measured(target, drafters, profile, "gumiho", "bfloat16", True)
    assert choice.path.dtype == "bfloat16" and not choice.cost.screened
    cached = prof.cached_profile(target, drafters)
    assert [c.screened for c in cached.costs] == [p.dtype not in ("float32", "bfloat16") for p in paths]
    assert len(json.loads(prof.profile_path(target).read_text())[prof.profile_key(target)]) == 1  # renewed in place


def counting_measure(calls: list):
    """A stand-in for `prof.measure` that counts its calls in `calls` and returns a flat profile of this machine,
    without the time a measurement takes (tested above)."""
    def counting(target, drafters, **kwargs):
        calls.append(1)
        curve = flat_profile().costs[0]
        return MachineProfile(signature=prof.signature(target.device), model=target.name,
                              drafters={m: prof.drafter_key(d) for m, d in drafters.items()}, seconds=1.0,
                              costs=[PathCost(p, curve.verify_ms, curve.draft_ms)
                                     for p in prof.candidate_paths(target.device)])
    return counting


def test_the_profile_is_cached_and_measured_again_when_foreign_or_corrupt(cache_dir, monkeypatch):
    target, drafters = tiny_setup()
    calls = []

    monkeypatch.setattr(prof, "measure", counting_measure(calls))
    first = prof.load_or_measure(target, drafters, progress=False)
    assert prof.load_or_measure(target, drafters, progress=False) == first and len(calls) == 1
    path = prof.profile_path(target)
    store = json.loads(path.read_text())
    key = next(iter(store))
    entry = store[key][0]
    assert prof.load_or_measure(target, {"gumiho": drafters["gumiho"]}, progress=False) == first  # a subset
    assert len(calls) == 1
    entry["signature"]["name"] = "Some Other CPU"  # a new processor: measure again
    path.write_text(json.dumps(store))
    prof.load_or_measure(target, drafters, progress=False)
    assert len(calls) == 2
    for corrupt in ("{not json", "[1, 2]", json.dumps({key: [{"version": 2, "costs": "x"}]}),
                    json.dumps({key: [{**entry, "version": 99}]}), json.dumps({key: "x"})):
        path.write_text(corrupt)
        prof.load_or_measure(target, drafters, progress=False)
    assert len(calls) == 7
    assert prof.load_or_measure(target, drafters, progress=False).signature == prof.signature(target.device)
    assert len(calls) == 7



def test_a_changed_kernel_is_timed_again(cache_dir, monkeypatch):
    """The profile times the kernels: a new version of their sources (an update of this project) is measured anew,
    the same sources are not."""
    target, drafters = tiny_setup()
    calls = []

    monkeypatch.setattr(prof, "measure", counting_measure(calls))
    prof.load_or_measure(target, drafters, progress=False)
    prof.load_or_measure(target, drafters, progress=False)
    assert len(calls) == 1
    assert len(kernels.source_digest()) == 12
    monkeypatch.setattr(kernels, "source_digest", lambda: "another00000")
    assert prof.load_or_measure(target, drafters, progress=False).signature["kernels"] == "another00000"
    assert len(calls) == 2

def flat_profile(fast: str = "bfloat16") -> MachineProfile:
    """Two paths; `fast` verifies everything in half the time of the other. Verification grows with n."""
    costs = []
    for dtype in ("float32", "bfloat16"):
        scale = 0.5 if dtype == fast else 1.0
        curve = [scale * (20 + 0.5 * n) for n in SIZES]
        costs.append(PathCost(ExecPath(dtype), {kv: curve for kv in prof.KV_LENGTHS},
                              {m: {k: scale * (4 + k) for k in (3, 4, 6, 8)} for m in ("eagle2", "gumiho")}))
    return MachineProfile(signature={}, model="m", drafters={}, costs=costs, seconds=1.0)


def deep_acceptance() -> Acceptance:
    """Wider trees accept deeper: with top_k 6 each cycle accepts ranks 0, 3, 10, 30 (running maxima)."""
    return Acceptance({3: [[0, 2]] * 10, 4: [[0, 3, 7]] * 10, 6: [[0, 3, 10, 30]] * 10, 8: [[0, 40]] * 10})


def test_a_verification_curve_that_falls_with_n_is_fitted_nondecreasing():
    """A busy moment timed one token at 39.4 ms and two at 37.0 (a real cached profile, AVX2 EPYC): the fit pools
    them (38.2 both) and keeps what rises; a cached profile is fitted as it loads, a curve that rises is kept as is."""
    noisy = [39.4, 37.0, 38.8, 47.2, 56.7, 63.4, 77.6, 91.3, 141.1, 186.7, 300.1, 340.9]
    rising = [26.3, 28.6, 30.9, 33.1, 46.0, 51.1, 63.4, 77.4, 115.6, 141.6, 309.5, 383.1]
    cost = PathCost(ExecPath("int4"), {256: noisy, 1024: rising})
    fitted = cost.verify_ms[256]
    assert fitted[:3] == pytest.approx([38.2, 38.2, 38.8]) and fitted[3:] == noisy[3:]
    assert cost.verify_ms[1024] == rising
    assert all(a <= b for a, b in zip(fitted, fitted[1:]))
    assert sum(fitted) == pytest.approx(sum(noisy))  # least squares under the order: pooled runs keep their mean
    assert cost.verify_at(1, 256) == cost.verify_at(2, 256) < cost.verify_at(3, 256)
    assert prof.nondecreasing([5.0, 1.0, 3.0, 2.0]) == pytest.approx([2.75] * 4)
    assert prof.nondecreasing([1.0, 5.0, 2.0, 2.0, 6.0]) == [1.0, 3.0, 3.0, 3.0, 6.0]
    store = {"signature": {}, "model": "m", "drafters": {}, "seconds": 1.0, "version": prof.VERSION,
             "costs": [{"path": {"dtype": "int4", "forward": "lean", "pack": True},
                        "verify_ms": {"256": noisy, "1024": rising}, "draft_ms": {}, "head_ms": 1.0,
                        "small_draft_ms": {}, "head_together": True, "head_alone_ms": 3.0,
                        "screened": False}]}
    loaded = MachineProfile.from_dict(store).costs[0]
    assert loaded.verify_ms[256] == fitted and loaded.head_together and loaded.head_alone_ms == 3.0


def test_head_rows_are_costed_as_the_walk_computes_them():
    """A head that computes rows together: the rows of the draft's likeliest path come with the root's product
    (head_ms each), a row read off it costs a product of its own (head_alone_ms); a head that does not: every row
    is a product of its own (head_ms)."""
    curve = [10.0 + n for n in SIZES]
    together = PathCost(ExecPath("int4"), {256: curve, 1024: curve}, head_ms=0.25, head_together=True,
                        head_alone_ms=2.0)
    assert together.cycle_ms(3, 2, 0.5, 256) == pytest.approx(13.0 + 2 * 0.25 + 0.5 * 2.0)
    # a chain of n tokens: min(n, 4) rows in one product whatever is accepted; accepted rows past them alone
    assert together.tree_cycle_ms(3, 0.4, 256) == pytest.approx(13.0 + 2 * 0.25)
    assert together.tree_cycle_ms(6, 4.5, 256) == pytest.approx(16.0 + 3 * 0.25 + 1.5 * 2.0)
    alone = PathCost(ExecPath("float32"), {256: curve, 1024: curve}, head_ms=2.0)
    assert alone.tree_cycle_ms(3, 0.4, 256) == alone.cycle_ms(3, 0, 0.4, 256) == pytest.approx(13.0 + 0.8)


def test_acceptance_gives_the_tau_each_tree_size_would_have_had(tmp_path):
    acc = deep_acceptance()
    assert acc.tau(6, 2) == 2.0 and acc.tau(6, 12) == 4.0 and acc.tau(6, 32) == 5.0
    acc.save(tmp_path)
    assert Acceptance.load(tmp_path) == acc


def test_a_corrupt_acceptance_file_is_ignored_with_a_warning(tmp_path, caplog):
    (tmp_path / "acceptance.json").write_text("{broken")
    assert Acceptance.load(tmp_path) is None
    assert "default tree" in caplog.text and "acceptance.json" in caplog.text
    caplog.clear()
    assert Acceptance.load(tmp_path / "missing") is None and caplog.text == ""  # none at all: no warning


def test_best_tree_maximises_expected_tokens_per_s():
    cost = flat_profile().costs[0]
    base = TreeSettings.default("gumiho", "cpu")
    chosen = best_tree(cost, "gumiho", base, deep_acceptance())
    rates = {}
    for k in (3, 4, 6, 8):
        for n in SIZES[1:]:
            widest = prof.widest_tree("gumiho", k)
            if n <= widest.total_tokens:
                tau = deep_acceptance().tau(k, n)
                rates[(k, n)] = 1e3 * tau / (cost.draft_ms["gumiho"][k] + cost.tree_cycle_ms(n, tau - 1, 512))
    cycle = {(k, n): cost.draft_ms["gumiho"][k] + cost.tree_cycle_ms(n, deep_acceptance().tau(k, n) - 1, 512)
             for k, n in rates}
    near = [t for t, rate in rates.items() if rate * (1 + CHEAPER_WITHIN) >= max(rates.values())]
    k, n = min(near, key=cycle.get)  # the cheapest cycle among the trees expected nearly as fast as the fastest
    assert (chosen.tree.top_k, chosen.tree.total_tokens) == (k, n)
    assert chosen.tokens_per_s == pytest.approx(rates[(k, n)])
    assert chosen.speedup == pytest.approx(rates[(k, n)] * cost.verify_at(1, 512) / 1e3)
    fixed = best_tree(cost, "gumiho", base, deep_acceptance(), top_k=4)
    assert fixed.tree.top_k == 4
    assert chosen.tree.sized and fixed.tree.sized  # automatic sizes are sized per cycle
    fixed_size = best_tree(cost, "gumiho", base, deep_acceptance(), total_tokens=8).tree
    assert not fixed_size.sized  # a fixed size is not
    # Prompt lookup's branches: kept in a fixed tree, none in a sized one (design.md §17.5).
    assert fixed_size.lookup_branches == base.lookup_branches > 0 and chosen.tree.lookup_branches == 0
    unknown = best_tree(cost, "gumiho", base, None)
    assert unknown.tree == replace(base, sized=True, lookup_branches=0) and "no acceptance statistics" in unknown.note


def test_a_cheaper_tree_expected_nearly_as_fast_is_preferred():
    """Two tree sizes, the larger expected 1% faster: the smaller one's cheaper cycle wins (the model leaves out
    costs that grow with the tree); 10% faster, the larger one wins."""
    verify = [10.0, 10.5, 11.0] + [20.0 + i for i in range(len(SIZES) - 3)]
    acc = Acceptance({2: [[0, 1]] * 10})  # every cycle accepts the first two ranks: tau(2, 2) = 2, tau(2, 3) = 3
    for gain, expected in ((1.01, 2), (1.10, 3)):
        # draft_ms for n = 3 set so that 3-token cycles are `gain` times the 2-token ones' tokens/s
        two = 2e3 / (5.0 + 10.5 + 1.0)
        draft3 = 3e3 / (two * gain) - 11.0 - 2.0
        cost = PathCost(ExecPath("int4"), {256: verify, 1024: verify}, {"gumiho": {2: 5.0}},
                        head_ms=1.0, small_draft_ms={"gumiho": {2: {2: 5.0, 3: draft3}}})
        chosen = best_tree(cost, "gumiho", TreeSettings.default("gumiho", "cpu"), acc, top_k=2)
        assert chosen.tree.total_tokens == expected, gain


@pytest.mark.parametrize("method", ["eagle2", "gumiho"])
def test_a_sized_two_token_tree_widens_to_its_first_level_where_the_head_computes_rows_together(method):
    """Dear tree tokens make 2 the size (top_k 1 the cheapest draft): where the head computes rows together the
    tree becomes a first-level one of ALL_ROWS tokens at the cheapest near top_k that has the candidates, rated at
    its 2-token core; rows one at a time, or a fixed size, keep the 2-token tree."""
    verify = [10.0 + 2.0 * (n - 1) for n in SIZES]
    acc = Acceptance({1: [[0]] * 5 + [[]] * 5, 2: [[0]] * 5 + [[1]] * 2 + [[]] * 3})
    drafts = {method: {1: 1.0, 2: 1.2}}
    together = PathCost(ExecPath("int4"), {256: verify, 1024: verify}, drafts, head_together=True, head_alone_ms=3.0)
    base = TreeSettings.default(method, "cpu")
    chosen = best_tree(together, method, base, acc)
    assert (chosen.tree.total_tokens, chosen.tree.top_k, chosen.tree.first_level) == (ALL_ROWS, 2, True)
    assert chosen.tree.sized and chosen.tree.drafted_depth == 0
    assert chosen.tokens_per_s == pytest.approx(1e3 * acc.tau(2, 2) / (1.2 + together.tree_cycle_ms(2, 0.5, 512)))
    assert rated_size(chosen.tree) == 2 and "first level" in Choice(
        together.path, {method: chosen}, "test").summary(method)
    apart = PathCost(ExecPath("float32"), {256: verify, 1024: verify}, drafts, head_ms=3.0)
    alone = best_tree(apart, method, base, acc)
    assert (alone.tree.total_tokens, alone.tree.top_k, alone.tree.first_level) == (2, 1, False)
    fixed = best_tree(together, method, base, acc, total_tokens=2)
    assert fixed.tree.total_tokens == 2 and not fixed.tree.first_level


def test_where_no_tree_pays_the_method_runs_ar_steps():
    cost = flat_profile().costs[0]
    costly = PathCost(cost.path, cost.verify_ms, {"gumiho": {k: 500.0 for k in (3, 4, 6, 8)}})
    chosen = best_tree(costly, "gumiho", TreeSettings.default("gumiho", "cpu"), deep_acceptance())
    assert chosen.tree.total_tokens == 1 and not chosen.tree.sized and chosen.speedup == 1.0
    assert "does not pay" in chosen.note


@pytest.mark.parametrize("fast", ["float32", "bfloat16"])
def test_choose_takes_the_faster_path_unless_a_dtype_is_given(fast):
    acc = {"eagle2": deep_acceptance(), "gumiho": deep_acceptance()}
    choice = choose(flat_profile(fast), ["ar", "eagle2", "gumiho"], "gumiho", acc, "cpu")
    assert choice.path.dtype == fast
    assert set(choice.methods) == {"ar", "eagle2", "gumiho"} and choice.methods["ar"].tree is None
    slow = "float32" if fast == "bfloat16" else "bfloat16"
    assert choose(flat_profile(fast), ["ar", "gumiho"], "gumiho", acc, "cpu", dtype=slow).path.dtype == slow
    assert "expected" in choice.summary("gumiho") and "Gumiho tree" in choice.summary("gumiho")
    with pytest.raises(GumihoError, match="no float16 path"):
        choose(flat_profile(fast), ["ar"], "ar", acc, "cpu", dtype="float16")
    default = choose(flat_profile(fast), ["ar", "gumiho"], "gumiho", acc, "cpu", auto_trees=False)
    assert default.methods["gumiho"].tree == TreeSettings.default("gumiho", "cpu")


def test_the_engine_uses_the_chosen_trees_and_records_the_choice():
    engine = tiny_engine(seed=2, vocab=16)
    acc = {"eagle2": deep_acceptance(), "gumiho": deep_acceptance()}
    engine.choice = choose(flat_profile("float32"), ["ar", "eagle2", "gumiho"], "gumiho", acc, "cpu")
    trace = engine.generate("", "gumiho", GenerationConfig(max_new_tokens=6), prompt_ids=[1, 2, 3])
    assert trace.settings.tree == engine.choice.methods["gumiho"].tree.to_dict()
    assert trace.settings.choice.startswith("fp32, lean forward, Gumiho tree")
    assert trace.settings.dtype == "float32" and trace.settings.forward == "lean"
    again = GenerationTrace.from_json(trace.to_json())
    assert again.settings == trace.settings


def test_version_1_traces_still_load():
    engine = tiny_engine(seed=2, vocab=16)
    data = engine.generate("", "ar", GenerationConfig(max_new_tokens=3), prompt_ids=[1, 2]).to_dict()
    data["schema"] = 1
    for key in ("dtype", "forward", "choice"):
        del data["settings"][key]
    old = GenerationTrace.from_dict(data)
    assert old.settings.dtype == "float32" and old.settings.forward == "transformers" and old.settings.choice == ""


@pytest.mark.parametrize("text, expected", [("auto", None), ("bf16", "bfloat16"), ("float32", "float32"),
                                            ("half", "float16")])
def test_dtype_names(text, expected):
    assert parse_dtype(text) == expected


@pytest.mark.parametrize("bad", ["int8", "fp64", "BF16 "])
def test_unknown_dtypes_are_refused(bad):
    with pytest.raises(GumihoError, match="unknown dtype"):
        parse_dtype(bad)


@pytest.mark.parametrize("bad", ["gpu", "tpu:0", "cuda:x"])
def test_unknown_devices_are_refused(bad):
    with pytest.raises(GumihoError):
        pick_device(bad)


def test_bf16_units_are_read_from_the_processor(monkeypatch):
    monkeypatch.setattr(prof, "cpu_features", lambda: ["avx2", "fma"])
    assert prof.bf16_units(torch.device("cpu")) == ""
    assert ExecPath("bfloat16") in prof.candidate_paths(torch.device("cpu"))  # measured, not assumed slow
    monkeypatch.setattr(prof, "cpu_features", lambda: ["avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16"])
    assert prof.bf16_units(torch.device("cpu")) == "AMX"
    assert ExecPath("bfloat16") in prof.candidate_paths(torch.device("cpu"))


def test_calibrate_cli_writes_acceptance_statistics(monkeypatch, tmp_path, capsys):
    from gumiho import loader
    from gumiho.__main__ import main

    monkeypatch.setattr(loader, "build_engine", lambda *a, **k: tiny_engine(seed=3))
    assert main(["calibrate", "--method", "eagle2", "--out", str(tmp_path), "--max-new-tokens", "4"]) == 0
    acceptance = Acceptance.load(tmp_path)
    assert acceptance is not None and sorted(acceptance.prefix_ranks) == list(prof.TOP_KS)
    assert "wrote" in capsys.readouterr().err
    kept = {k: v for k, v in acceptance.prefix_ranks.items() if k != 2}
    Acceptance({**kept, 2: [[99]]}).save(tmp_path)
    assert main(["calibrate", "--method", "eagle2", "--out", str(tmp_path), "--max-new-tokens", "4",
                 "--top-ks", "2"]) == 0
    merged = Acceptance.load(tmp_path).prefix_ranks
    assert {k: v for k, v in merged.items() if k != 2} == kept, "the other top_ks keep their statistics"
    assert merged[2] == acceptance.prefix_ranks[2], "top_k 2 is measured again (the same greedy runs)"
    assert main(["calibrate", "--method", "ar", "--out", str(tmp_path)]) == 2
    with pytest.raises(SystemExit) as stop:
        main(["calibrate", "--method", "eagle2", "--out", str(tmp_path), "--top-ks", "0"])
    assert stop.value.code == 2 and "--top-ks: must be >= 1" in capsys.readouterr().err


def test_calibrate_cli_reads_a_prompt_file(monkeypatch, tmp_path, capsys):
    from gumiho import loader
    from gumiho.__main__ import main
    from gumiho.calibrate import calibrate

    monkeypatch.setattr(loader, "build_engine", lambda *a, **k: tiny_engine(seed=3))
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "w3 w1 w2"}\n{"turns": ["w2 w2 w5", "a second turn is not read"]}\n')
    assert main(["calibrate", "--method", "eagle2", "--out", str(tmp_path), "--max-new-tokens", "4",
                 "--top-ks", "2", "--prompts", str(prompts)]) == 0
    direct = calibrate(tiny_engine(seed=3), "eagle2", top_ks=(2,), prompts=("w3 w1 w2", "w2 w2 w5"),
                       max_new_tokens=4, progress=False)
    assert Acceptance.load(tmp_path).prefix_ranks == direct.prefix_ranks
    capsys.readouterr()
    assert main(["calibrate", "--method", "eagle2", "--out", str(tmp_path), "--prompts", str(tmp_path / "no")]) == 2
    err = capsys.readouterr().err.strip()
    assert "cannot read" in err and len(err.splitlines()) == 1


def test_shipped_calibration_prompts_are_not_benchmark_prompts():
    from gumiho.prompts import read_prompt_file

    root = Path(__file__).resolve().parent.parent / "data"
    calibration = {r.turns[0] for r in read_prompt_file(root / "calibration" / "prompts.jsonl")}
    assert len(calibration) == 77
    benchmark = {turn for f in (root / "benchmarks").glob("*.jsonl") for r in read_prompt_file(f) for turn in r.turns}
    assert len(benchmark) > 400 and not calibration & benchmark
