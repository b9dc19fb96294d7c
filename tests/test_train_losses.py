"""Loss functions on tiny tensors with known values, and the loss alignment of the training forward."""

from __future__ import annotations

import math

import pytest
import torch

from gumiho.train.batches import Batch, plan_batches
from gumiho.train.losses import feature_loss, head_weights, soft_cross_entropy
from gumiho.drafters.layers import KVCache
from gumiho.train.objective import LossWeights, batch_losses, unrolled_outputs
from gumiho.train.trainer import assistant_counts, frequency_vocab, lr_lambda
from gumiho.train.features import Sequence
from tests.conftest import random_drafter, tiny_target


def test_feature_loss_is_smooth_l1_mean():
    pred = torch.zeros(1, 2)
    target = torch.tensor([[0.5, 2.0]])  # 0.5 * 0.5^2 = 0.125 (quadratic part), 2 - 0.5 = 1.5 (linear part)
    assert feature_loss(pred, target).item() == pytest.approx((0.125 + 1.5) / 2)
    assert feature_loss(torch.zeros(0, 2), torch.zeros(0, 2)).item() == 0.0


def test_soft_cross_entropy_against_teacher_distribution():
    logits = torch.tensor([[0.0, math.log(3.0)]])  # q = (1/4, 3/4)
    teacher = torch.zeros(1, 2)  # p = (1/2, 1/2)
    expected = -(0.5 * math.log(0.25) + 0.5 * math.log(0.75))
    assert soft_cross_entropy(logits, teacher).item() == pytest.approx(expected, rel=1e-6)
    # Minimal (= teacher entropy) when the draft matches the teacher.
    assert soft_cross_entropy(teacher, teacher).item() == pytest.approx(math.log(2.0), rel=1e-6)


def test_head_weights_decay():
    assert head_weights(3) == pytest.approx([0.8 / 9, 0.64 / 9, 0.512 / 9])


def test_lr_schedule_warms_up_then_decays_to_zero():
    f = lr_lambda(warmup=4, total=12)
    assert [f(s) for s in (0, 3)] == [0.25, 1.0]
    assert f(8) == pytest.approx(0.5) and f(12) == 0.0


def test_plan_batches_respects_token_budget():
    lengths = [10, 50, 12, 48, 30, 5]
    groups = plan_batches(lengths, batch_tokens=60)
    assert sorted(i for g in groups for i in g) == list(range(6))
    assert all(max(lengths[i] for i in g) * len(g) <= 60 or len(g) == 1 for g in groups)


def test_frequency_vocab_ranks_assistant_tokens():
    seq = Sequence(torch.tensor([9, 9, 5, 5, 5, 7, 3]), torch.tensor([1, 1, 1, 1, 1, 1, 0]).bool(), torch.zeros(7, 2))
    ids, coverage = frequency_vocab(assistant_counts([seq], vocab_size=10), size=2, always={3})
    assert ids.tolist() == [3, 5]  # 3 is forced in although masked; 5 is the most frequent assistant token
    assert coverage == pytest.approx(3 / 6)


def _batch(target, length: int, loss_at: int) -> Batch:
    torch.manual_seed(1)
    ids = torch.randint(1, target.vocab_size, (1, length))
    feats = target.model.model(input_ids=ids).last_hidden_state
    mask = torch.zeros(1, length, dtype=torch.bool)
    mask[0, loss_at] = True
    return Batch(ids, mask, feats, length)


@pytest.mark.parametrize("kind", ["eagle2", "gumiho"])
def test_losses_read_the_right_slots(kind):
    """With one masked token x_p, the serial loss compares h_{p-2} with f_{p-1} and MLP head 0 compares its
    prediction from slot p-4 with f_{p-1}."""
    target = tiny_target(vocab=32)
    drafter = random_drafter(kind, target, scale=0.2).attach(target.embed_weight, target.head_weight)
    p = 9
    batch = _batch(target, 14, p)
    ids, f = batch.input_ids[0], batch.features[0]
    _, parts = batch_losses(drafter, batch, LossWeights(), noise=0.0)
    tr = drafter.transformer
    with torch.no_grad():
        h = tr(tr.fuse(drafter.embed(ids[1:]), f[:-1])[None], torch.arange(13))[0]
        assert parts["lv"].item() == pytest.approx(feature_loss(h[p - 2: p - 1], f[p - 1: p]).item(), rel=1e-5)
        if kind == "gumiho":
            t = p - 4
            u = torch.cat([tr.fuse(drafter.embed(ids[t + 2]), h[t]), tr.fuse(drafter.embed(ids[t + 3]), h[t + 1])])
            out = drafter.heads(u[None])[0]
            assert parts["lv_mlp0"].item() == pytest.approx(feature_loss(out, f[p - 1: p]).item(), rel=1e-5)
            assert "lv_mlp1" in parts


@pytest.mark.parametrize("kind", ["medusa", "hydra"])
def test_head_losses_read_the_right_slots(kind):
    """With one masked token x_p, head k compares its prediction from f_{p-k-2} (Hydra: and x_{p-k-1} .. x_{p-1})
    with f_{p-1}; its terms weigh 0.8^k."""
    target = tiny_target(vocab=32)
    drafter = random_drafter(kind, target, scale=0.2).attach(target.embed_weight, target.head_weight)
    p = 9
    batch = _batch(target, 14, p)
    ids, f = batch.input_ids[0], batch.features[0]
    weights = LossWeights(head_feature=1.0, head_ce=0.5)
    with torch.no_grad():
        total, parts = batch_losses(drafter, batch, weights, noise=0.0)
        expected = 0.0
        for k in range(4):
            out = drafter.predict(f[p - k - 2][None], ids[p - k - 1: p][None], k)
            suffix = "" if k == 0 else f"_step{k + 1}"
            assert parts[f"lv{suffix}"].item() == pytest.approx(feature_loss(out, f[p - 1: p]).item(), rel=1e-5)
            teacher = f[p - 1: p] @ drafter.head_weight.T
            lp = soft_cross_entropy(out @ drafter.head_weight.T, teacher)
            assert parts[f"lp{suffix}"].item() == pytest.approx(lp.item(), rel=1e-5)
            expected += 0.8**k * (parts[f"lv{suffix}"] + 0.5 * parts[f"lp{suffix}"])
    assert total.item() == pytest.approx(expected.item(), rel=1e-5)


def test_vocab_coverage_counts_greedy_tokens_inside_the_draft_vocabulary():
    from gumiho.train.evaluate import vocab_coverage

    target = tiny_target(vocab=32)
    drafter = random_drafter("eagle2", target)
    ids = torch.randint(0, 32, (1, 12), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        feats = target.model.model(input_ids=ids).last_hidden_state[0]
    seq = Sequence(ids[0], torch.tensor([0] * 4 + [1] * 8).bool(), feats.half())
    greedy = (feats[3:11].half().float() @ target.head_weight.T).argmax(-1)
    drafter.draft_vocab = greedy[:3].unique()
    expected = sum(int(g in drafter.draft_vocab.tolist()) for g in greedy.tolist()) / 8
    assert vocab_coverage(drafter, target, [seq]) == pytest.approx(expected, abs=1e-4)


def test_a_drafter_trained_on_a_draft_vocabulary_can_propose_from_the_whole_one():
    from gumiho.drafters import new_drafter

    target = tiny_target(vocab=32)
    drafter = new_drafter("eagle2", target.model.config, draft_vocab_size=8)
    drafter.draft_vocab = torch.tensor([3, 5, 7, 11, 13, 17, 19, 23])
    hidden = torch.randn(4, 32, generator=torch.Generator().manual_seed(0))
    restricted = drafter.attach(target.embed_weight, target.head_weight).head_logits(hidden)
    full = drafter.use_full_vocab().attach(target.embed_weight, target.head_weight).head_logits(hidden)
    assert restricted.shape == (4, 8) and full.shape == (4, 32) and drafter.config.draft_vocab_size == 0
    torch.testing.assert_close(full[:, [3, 5, 7, 11, 13, 17, 19, 23]], restricted)  # the same head rows
    assert torch.equal(drafter.top_tokens(hidden, 1)[1][:, 0], full.argmax(-1))  # ids of the whole vocabulary


@pytest.mark.parametrize("kind", ["eagle2", "gumiho"])
def test_unrolled_steps_match_drafting_on_own_outputs(kind):
    """Step k of the training-time test at slot j equals drafting k tokens after slot j with a KV cache: the same
    inputs, positions and context (true-feature keys up to j, then the draft's own keys)."""
    target = tiny_target(vocab=32)
    drafter = random_drafter(kind, target, scale=0.2).attach(target.embed_weight, target.head_weight)
    tr, hidden = drafter.transformer, target.hidden_size
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 32, (1, 12), generator=generator)
    feats = torch.randn(1, 12, hidden, generator=generator)
    with torch.no_grad():
        outputs = unrolled_outputs(drafter, ids, feats[:, :-1], unroll=3)
        for j in (0, 4, 7):
            cache = KVCache(len(tr.layers))
            h = tr(tr.fuse(drafter.embed(ids[:, 1: j + 2]), feats[:, : j + 1]), torch.arange(j + 1), None, cache)[:, -1:]
            torch.testing.assert_close(h[:, 0], outputs[0][:, j], rtol=1e-5, atol=1e-5)
            for k in (2, 3):
                everything = torch.ones(1, 1, 1, cache.length + 1, dtype=torch.bool)
                h = tr(tr.fuse(drafter.embed(ids[:, j + k: j + k + 1]), h), torch.tensor([j + k - 1]), everything, cache)
                torch.testing.assert_close(h[:, 0], outputs[k - 1][:, j], rtol=1e-5, atol=1e-5)


def test_unrolled_losses_add_a_term_per_step_and_feed_gumiho_heads_step_two():
    target = tiny_target(vocab=32)
    drafter = random_drafter("gumiho", target, scale=0.2).attach(target.embed_weight, target.head_weight)
    batch = _batch(target, 14, 9)
    batch.loss_mask[:] = True
    with torch.no_grad():
        one, parts_one = batch_losses(drafter, batch, LossWeights(), noise=0.0)
        three, parts = batch_losses(drafter, batch, LossWeights(), noise=0.0, unroll=3)
    assert {"acc2", "acc3", "lv_step2", "lp_step3"} <= parts.keys() and "acc2" not in parts_one
    assert parts["lv"].item() == pytest.approx(parts_one["lv"].item(), rel=1e-6)  # step 1 is unchanged
    assert parts["lv_mlp0"].item() != pytest.approx(parts_one["lv_mlp0"].item(), rel=1e-6)  # heads read step 2
    steps = sum(parts[k] + 0.1 * parts[k.replace("lv", "lp")] for k in ("lv", "lv_step2", "lv_step3"))
    assert steps.item() < three.item()  # the rest are the MLP heads' terms, all positive
