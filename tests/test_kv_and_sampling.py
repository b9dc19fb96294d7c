"""KV compaction and lossless speculative sampling."""

from __future__ import annotations

import pytest
import torch

from gumiho.engine import Engine, GenerationConfig
from gumiho.kv import keep_accepted
from gumiho.sampling import SamplingConfig, probabilities
from gumiho.target import Target
from gumiho.tree import DraftPool, build_tree
from gumiho.verify import verify_sampling

from .conftest import tiny_engine, tiny_target


def small_tree(root: int):
    """root -> 3 children; the first child -> 2 children; one grandchild -> 1 child (7 nodes)."""
    pool = DraftPool()
    t = torch.tensor
    pool.add(t([1, 2, 3]), t([-1, -1, -1]), t([-0.1, -0.2, -0.3]), "eagle-1", 1)
    pool.add(t([0, 3]), t([0, 0]), t([-0.4, -0.5]), "eagle-2", 2)
    pool.add(t([2]), t([3]), t([-0.6]), "eagle-3", 3)
    return build_tree(root, pool, 7)


def tree_logits(target, prefix: list[int], tree):
    cache = target.new_cache()
    target.features(torch.tensor(prefix), cache)
    mask = torch.cat([torch.ones(tree.size, len(prefix), dtype=torch.bool), tree.mask], 1)[None, None]
    features = target.features(tree.tokens, cache, tree.position_ids + len(prefix), mask)
    return target.logits(features), cache


@pytest.mark.parametrize("path_row", [0, 1, 2, 3])
def test_kv_compaction_matches_a_sequential_run(path_row):
    target = tiny_target(seed=7, vocab=8)
    prefix = [1, 5, 2, 7, 3]
    tree = small_tree(root=4)
    logits, cache = tree_logits(target, prefix, tree)
    nodes = [n for n in tree.paths[path_row].tolist() if n >= 0]
    path_tokens = tree.tokens[nodes].tolist()
    keep_accepted(cache, len(prefix), torch.tensor(nodes))
    assert cache.get_seq_length() == len(prefix) + len(nodes)
    next_token = 6
    after = target.logits(target.features(torch.tensor([next_token]), cache))

    fresh = target.new_cache()
    sequential = target.logits(target.features(torch.tensor(prefix + path_tokens + [next_token]), fresh))
    assert torch.allclose(after[-1], sequential[-1], atol=1e-4)
    # The tree forward's own logits along the path equal the sequential ones too (tree attention is exact).
    assert torch.allclose(logits[nodes], sequential[len(prefix) - 1 + 1 : len(prefix) + len(nodes)], atol=1e-4)


def chi_square(counts: torch.Tensor, probs: torch.Tensor) -> tuple[float, int]:
    """Pearson statistic over cells with an expected count >= 5 (the rest pooled); returns (statistic, dof)."""
    n = counts.sum()
    expected = probs * n
    big = expected >= 5
    obs = torch.cat([counts[big], counts[~big].sum()[None]])
    exp = torch.cat([expected[big], expected[~big].sum()[None]])
    keep = exp > 0
    stat = ((obs[keep] - exp[keep]) ** 2 / exp[keep]).sum()
    return float(stat), int(keep.sum()) - 1


def assert_matches(counts: torch.Tensor, probs: torch.Tensor) -> None:
    stat, dof = chi_square(counts.double(), probs.double())
    # Under the null the statistic has mean dof and sd sqrt(2 dof); 6 sd leaves no room for flakiness.
    assert stat < dof + 6 * (2 * dof) ** 0.5 + 10, f"chi2 {stat:.1f} with {dof} dof"


@pytest.mark.parametrize("cfg", [SamplingConfig(temperature=0.7), SamplingConfig(temperature=1.0),
                                 SamplingConfig(temperature=1.0, top_p=0.8), SamplingConfig(temperature=0.7, top_k=3)])
def test_tree_rejection_sampling_is_lossless(cfg):
    """First emitted token ~ p(root); given that child c was accepted, the next token ~ p(c)."""
    target = tiny_target(seed=11, vocab=8, logit_scale=1.5)
    tree = small_tree(root=4)
    logits, _ = tree_logits(target, [3, 1, 4, 1, 5], tree)
    generator = torch.Generator().manual_seed(0)
    first = torch.zeros(8)
    second = {c: torch.zeros(8) for c in tree.children()[0]}
    for _ in range(12000):
        acceptance = verify_sampling(tree, logits, cfg, generator)
        tokens = tree.tokens[acceptance.nodes[1:]].tolist() + [acceptance.bonus]
        first[tokens[0]] += 1
        if len(acceptance.nodes) > 1:
            second[acceptance.nodes[1]][tokens[1]] += 1
    assert_matches(first, probabilities(logits[0], cfg))
    tested = 0
    for child, counts in second.items():
        if counts.sum() > 500:
            assert_matches(counts, probabilities(logits[child], cfg))
            tested += 1
    assert tested >= 1


def exact_joint(target, prefix: list[int], cfg: SamplingConfig, vocab: int, length: int) -> torch.Tensor:
    """Exact probability of every continuation of `length` tokens under the target's processed distribution."""
    joint = torch.ones(1)
    seqs = [[]]
    for _ in range(length):
        rows = []
        for seq in seqs:
            cache = target.new_cache()
            logits = target.logits(target.features(torch.tensor(prefix + seq), cache))[-1]
            rows.append(probabilities(logits, cfg))
        joint = (joint[:, None] * torch.stack(rows)).flatten()
        seqs = [s + [v] for s in seqs for v in range(vocab)]
    return joint


def in_dtype(engine: Engine, dtype: torch.dtype) -> Engine:
    """The same target and drafters run in another dtype (the drafters follow the target's when attached)."""
    t = engine.target
    target = Target(model=t.model.to(dtype), tokenizer=t.tokenizer, name=t.name, device=t.device, dtype=dtype,
                    eos_ids=t.eos_ids)
    other = Engine(target)
    for method, drafter in engine.drafters.items():
        other.add_drafter(method, drafter)
    return other


@pytest.mark.parametrize("method,temperature,dtype", [("eagle2", 0.7, torch.float32), ("gumiho", 1.0, torch.float32),
                                                      ("gumiho", 1.0, torch.bfloat16), ("medusa", 1.0, torch.float32),
                                                      ("hydra", 0.7, torch.float32), ("lookup", 1.0, torch.float32),
                                                      ("lookup", 0.7, torch.bfloat16), ("recycle", 0.7, torch.float32),
                                                      ("recycle", 1.0, torch.bfloat16),
                                                      ("eagle2+branches", 1.0, torch.float32)])
def test_engine_sampling_matches_the_target_distribution(method, temperature, dtype):
    """Lossless in every dtype: in bf16 too, each emitted token follows the target's (bf16) distribution. The
    draft-free methods' guesses are deterministic (a point mass on each drafted token), as every drafter's here;
    so are trees of a drafter's and prompt lookup's candidates together (eagle2+branches)."""
    vocab, length, prefix = 4, 3, [0, 2, 1, 3]
    if method in ("lookup", "eagle2+branches"):  # every token followed by each of the four somewhere earlier
        prefix = [0, 0, 1, 0, 2, 0, 3, 1, 1, 2, 1, 3, 2, 2, 3, 3, 0]
    engine = tiny_engine(seed=12, vocab=vocab, drafter_seed=12)
    engine.target.model.lm_head.weight.mul_(0.5)  # flatter, so that every cell is visited
    engine = in_dtype(engine, dtype)
    from gumiho.tree import TreeSettings

    tree = {"eagle2+branches": TreeSettings(top_k=2, depth=3, total_tokens=8, lookup_branches=1),
            "eagle2": TreeSettings(top_k=2, depth=3, total_tokens=8),
            "gumiho": TreeSettings(top_k=2, depth=3, total_tokens=8, mlptopk=2, pruning=2),
            "lookup": TreeSettings(top_k=8, depth=3, total_tokens=8, max_ngram=3, min_ngram=1),
            "recycle": TreeSettings(top_k=2, depth=3, total_tokens=8)}.get(
        method, TreeSettings(top_k=10, depth=3, total_tokens=8))  # the static tree's first 7 paths: ranks 0..2
    method = method.removesuffix("+branches")
    cfg = SamplingConfig(temperature=temperature)
    counts = torch.zeros(vocab**length)
    accepted = 0
    for seed in range(700):
        trace = engine.generate("", method, GenerationConfig(max_new_tokens=length, sampling=cfg, seed=seed,
                                                              tree=tree, trace=False), prompt_ids=prefix)
        a, b, c = trace.token_ids
        counts[(a * vocab + b) * vocab + c] += 1
        accepted += trace.new_tokens - 1 - trace.cycles
    assert accepted > 150, "drafts must be accepted for this test to mean anything"
    assert_matches(counts, exact_joint(engine.target, prefix, cfg, vocab, length))
