"""A few training steps on a tiny random target reduce the loss; checkpoints resume; drafters round-trip;
chain accuracy matches step-by-step drafting."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from gumiho.drafters import Drafter
from gumiho.drafters.layers import KVCache
from gumiho.errors import GumihoError
from gumiho.train.batches import collate
from gumiho.train.data import Rendered
from gumiho.train.evaluate import chain_accuracy, chain_predictions, tau_on_prompts, vocab_coverage
from gumiho.train.features import load_sequences, target_features, write_shard
from gumiho.train.ship import ship
from gumiho.train.objective import LossWeights, batch_losses
from gumiho.train import trainer
from gumiho.train.trainer import PROBE_SKIP, TrainConfig, build_drafter, fit_to_budget, lr_lambda, train
from tests.conftest import random_drafter, tiny_target


def _greedy_corpus(target, n: int = 4, prompt: int = 4, reply: int = 16) -> list[Rendered]:
    """Sequences whose replies are the tiny target's own greedy continuations (self-distillation in miniature)."""
    generator = torch.Generator().manual_seed(0)
    out = []
    for i in range(n):
        ids = torch.randint(0, target.vocab_size, (1, prompt), generator=generator)
        with torch.no_grad():
            full = target.model.generate(ids, max_new_tokens=reply, do_sample=False, min_new_tokens=reply,
                                         pad_token_id=0)
        out.append(Rendered(f"c{i}", full[0].tolist(), [0] * prompt + [1] * reply))
    return out


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    target = tiny_target(vocab=32)
    folder = tmp_path_factory.mktemp("features")
    rendered = _greedy_corpus(target)
    write_shard(folder / "shard-00000.safetensors", rendered, target_features(target, rendered))
    return target, folder


def _config(kind: str, data, out, **kw) -> TrainConfig:
    base = dict(drafter=kind, data=str(data), out=str(out), draft_vocab=16, epochs=4, lr=3e-3, warmup_steps=2,
                batch_tokens=64, noise=0.0, checkpoint_every=5, log_every=5, mlp_ce_epoch=1)
    base.update(kw)
    return TrainConfig(**base)


KINDS = ["eagle2", "gumiho", "medusa", "hydra"]


@pytest.mark.parametrize("kind", KINDS)
def test_training_reduces_the_loss_and_writes_a_loadable_drafter(corpus, tmp_path, kind):
    target, data = corpus
    config = _config(kind, data, tmp_path / "run", epochs=8)
    run = train(config, target)
    summary = json.loads((run / "train.json").read_text())
    sequences = load_sequences(data)
    initial, _ = build_drafter(config, target, sequences)
    drafter = Drafter.from_pretrained(run / "drafter").attach(target.embed_weight, target.head_weight)
    batch = collate(sequences, target.device)
    with torch.no_grad():
        before, _ = batch_losses(initial, batch, LossWeights(), noise=0.0)
        after, parts = batch_losses(drafter, batch, LossWeights(), noise=0.0)
    # The heads' soft CE cannot go below the target's own entropy 2..5 tokens ahead, which they cannot see.
    assert after.item() < (0.85 if kind in ("medusa", "hydra") else 0.6) * before.item()
    assert summary["tokens_seen"] == 8 * summary["tokens_per_epoch"]
    assert drafter.draft_vocab.shape == (16,) and len(set(drafter.draft_vocab.tolist())) == 16
    if kind == "gumiho":
        assert "acc_mlp4" in parts
    if kind in ("medusa", "hydra"):
        assert {"acc1", "acc4", "lp_step4"} <= parts.keys()  # head k's terms, named by the depth it drafts
    shipped = ship(run, tmp_path / "shipped")
    assert "Tokens seen: " + f"{summary['tokens_seen']:,}" in (shipped / "README.md").read_text()
    half = Drafter.from_pretrained(shipped)
    for key, value in drafter.state_dict().items():
        if value.is_floating_point():
            torch.testing.assert_close(half.state_dict()[key], value, atol=1e-3, rtol=1e-3)


def test_resume_continues_from_the_checkpoint(corpus, tmp_path):
    target, data = corpus
    out = tmp_path / "run"
    train(_config("eagle2", data, out, epochs=2), target)
    first = Drafter.from_pretrained(out / "drafter").state_dict()
    saved = torch.load(out / "checkpoint.pt", weights_only=False)
    assert saved["state"]["epoch"] == 2
    train(_config("eagle2", data, out, epochs=2), target)  # nothing left to do: same weights
    again = Drafter.from_pretrained(out / "drafter").state_dict()
    assert all(torch.equal(first[k], again[k]) for k in first)
    with pytest.raises(GumihoError, match="other settings"):
        train(_config("eagle2", data, out, epochs=3), target)


def test_max_steps_caps_the_run_and_the_schedule_ends_at_it(corpus, tmp_path):
    target, data = corpus
    run = train(_config("eagle2", data, tmp_path / "run", epochs=8, max_steps=7), target)
    summary = json.loads((run / "train.json").read_text())
    assert summary["steps"] == 7 and json.loads((run / "length.json").read_text())["steps"] == 7
    assert summary["epochs_seen"] == pytest.approx(7 / json.loads((run / "length.json").read_text())["batches_per_epoch"],
                                                   abs=1e-3)
    factor = lr_lambda(2, 7)
    assert [round(factor(s), 3) for s in range(8)] == [0.5, 1.0, 1.0, 0.8, 0.6, 0.4, 0.2, 0.0]


def test_fit_to_budget_spends_what_is_left_at_the_given_speed():
    config = TrainConfig(drafter="eagle2", data="d", out="o", epochs=100, minutes=1.0)
    assert fit_to_budget(config, 20, 12.0, per_step=0.2, batches_per_epoch=50) == 20 + 240  # 48 s left
    assert fit_to_budget(config, 20, 70.0, per_step=0.2, batches_per_epoch=50) == 20  # over budget already: stop now
    small = TrainConfig(drafter="eagle2", data="d", out="o", epochs=2, minutes=60.0)
    assert fit_to_budget(small, 20, 12.0, per_step=0.2, batches_per_epoch=50) == 100  # never past the epochs
    assert PROBE_SKIP < 8


class SteppedClock:
    """Stands in for the trainer's clock, which it reads once at the start and once after every step: each step
    takes `first` seconds for the first `until` steps, then `later`."""

    def __init__(self, first: float, until: int, later: float):
        self.first, self.until, self.later, self.reads, self.now = first, until, later, 0, 1000.0

    def time(self) -> float:
        if self.reads:
            self.now += self.first if self.reads <= self.until else self.later
        self.reads += 1
        return self.now


def test_a_budgeted_run_that_slows_after_its_probe_still_ends_within_its_minutes(corpus, tmp_path, monkeypatch):
    """Timed at 1 s a step, 30 s fit 30 steps; from step 21 on a step takes 3 s (as when Gumiho's MLP losses start),
    so a length fixed once would end at 50 s. Refitted at every log line, the run ends inside its 30 s."""
    target, data = corpus
    monkeypatch.setattr(trainer, "time", SteppedClock(first=1.0, until=20, later=3.0))
    run = train(_config("eagle2", data, tmp_path / "run", epochs=500, minutes=0.5, probe_steps=8, log_every=2,
                        checkpoint_every=1000), target)
    summary = json.loads((run / "train.json").read_text())
    assert 20 < summary["steps"] < 30 and summary["wall_time_s"] <= 30
    assert json.loads((run / "length.json").read_text())["steps"] == summary["steps"]


def test_a_deadline_stops_the_run_with_its_drafter_saved_and_a_later_run_resumes(corpus, tmp_path, monkeypatch):
    target, data = corpus
    clock = SteppedClock(first=1.0, until=10**6, later=1.0)
    monkeypatch.setattr(trainer, "time", clock)
    # 1 s a step from t = 1000: steps 1..11 start before the deadline at 1010.5, step 12 would start after it.
    first = train(_config("eagle2", data, tmp_path / "run", epochs=500, max_steps=14, deadline=1010.5), target)
    summary = json.loads((first / "train.json").read_text())
    assert summary["steps"] == 11 and (first / "drafter" / "model.safetensors").exists()
    assert json.loads((first / "length.json").read_text())["steps"] == 11
    # The same run without a deadline (an option that says only when to stop) resumes instead of refusing.
    again = train(_config("eagle2", data, tmp_path / "run", epochs=500, max_steps=14), target)
    assert json.loads((again / "train.json").read_text())["steps"] == 14


def test_a_time_budget_fixes_the_length_and_a_matched_run_copies_it(corpus, tmp_path):
    target, data = corpus
    budget = train(_config("gumiho", data, tmp_path / "a", epochs=500, minutes=0.02, probe_steps=8), target)
    steps = json.loads((budget / "length.json").read_text())["steps"]
    summary = json.loads((budget / "train.json").read_text())
    assert 8 <= steps < 500 * json.loads((budget / "length.json").read_text())["batches_per_epoch"]
    assert summary["steps"] == steps
    matched = train(_config("eagle2", data, tmp_path / "b", epochs=500, max_steps=steps), target)
    assert json.loads((matched / "train.json").read_text())["tokens_seen"] == summary["tokens_seen"]


@pytest.mark.parametrize("kind", KINDS)
def test_save_load_round_trip(tmp_path, kind):
    target = tiny_target(vocab=32)
    drafter = random_drafter(kind, target, scale=0.2)
    drafter.save_pretrained(tmp_path / "d")
    loaded = Drafter.from_pretrained(tmp_path / "d")
    assert loaded.config == drafter.config
    for key, value in drafter.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value)


@pytest.mark.parametrize("kind", ["eagle2", "gumiho"])
def test_chain_predictions_match_step_by_step_drafting(corpus, kind):
    """Step 2 from origin i, computed for all origins at once, equals a fresh run over slots 0..i plus one step."""
    target, data = corpus
    seq = load_sequences(data)[0]
    drafter = random_drafter(kind, target, scale=0.2).attach(target.embed_weight, target.head_weight)
    predicted, labels, _ = chain_predictions(drafter, target, seq, depth=3 if kind == "eagle2" else 4)
    tr, ids, f = drafter.transformer, seq.input_ids, seq.features.float()
    for i in (3, 10):
        with torch.no_grad():
            cache = KVCache(drafter.config.num_layers)
            h = tr(tr.fuse(drafter.embed(ids[1: i + 2]), f[: i + 1])[None], torch.arange(i + 1), None, cache)[0, -1]
            step2 = tr(tr.fuse(drafter.embed(labels[i, :1]), h[None])[None], torch.tensor([i + 1]),
                       torch.ones(1, 1, 1, i + 2, dtype=torch.bool), cache)[0, 0]
        assert predicted[i, 0].item() == drafter.top_tokens(h[None], 1)[1].item()
        assert predicted[i, 1].item() == drafter.top_tokens(step2[None], 1)[1].item()
    assert vocab_coverage(drafter, target, [seq]) == 1.0  # no draft vocabulary: everything can be proposed
    accuracy = chain_accuracy(drafter, target, [seq], depth=3)
    assert all(a >= b for a, b in zip(accuracy, accuracy[1:]))  # a chain can only get shorter


def test_tau_on_prompts_skips_a_prompt_longer_than_the_context_and_counts_it(tmp_path):
    target = tiny_target(vocab=16)  # a context of 512 tokens
    drafter = random_drafter("eagle2", target, scale=0.2)
    prompts = tmp_path / "prompts.jsonl"
    lines = [" ".join(f"w{i % 16}" for i in range(n)) for n in (12, 600, 30, 500)]  # 500 + 16 new: no room
    prompts.write_text("".join(json.dumps({"prompt": line}) + "\n" for line in lines))
    result = tau_on_prompts(drafter, target, [str(prompts)], max_new_tokens=16)[str(prompts)]
    assert result["prompts"] == 2 and result["skipped"] == 2 and result["tau_mean"] >= 1.0
    prompts.write_text(json.dumps({"prompt": lines[1]}) + "\n")
    with pytest.raises(GumihoError, match="no prompt leaves room"):
        tau_on_prompts(random_drafter("eagle2", target, scale=0.2), target, [str(prompts)], max_new_tokens=16)


def test_tau_on_several_files_prepares_the_drafter_once(tmp_path, monkeypatch):
    """Preparing a drafter replaces its matmuls in place (on the int4 path its fc by a 4-bit module with no
    `weight`): `eval --prompts A --prompts B` once failed at B with an AttributeError."""
    from gumiho.target import Target

    target = tiny_target(vocab=16)
    drafter = random_drafter("eagle2", target, scale=0.2)
    prepared = []
    real = Target.prepare_drafter
    monkeypatch.setattr(Target, "prepare_drafter", lambda self, d: prepared.append(d) or real(self, d))
    files = []
    for name, n in (("a", 12), ("b", 30)):
        files.append(str(tmp_path / f"{name}.jsonl"))
        Path(files[-1]).write_text(json.dumps({"prompt": " ".join(f"w{i % 16}" for i in range(n))}) + "\n")
    result = tau_on_prompts(drafter, target, files, max_new_tokens=8)
    assert list(result) == files and all(r["prompts"] == 1 for r in result.values())
    assert prepared == [drafter]


@pytest.mark.parametrize("kind", ["medusa", "hydra"])
def test_head_chain_predictions_are_the_drafted_top_path(corpus, kind):
    """Depth k + 1 from origin i is head k's best token from f_i, the root x_{i+1} and the greedy tokens before it:
    the drafted tree's all-first path wherever the earlier tokens were right (Medusa's heads read no tokens, so
    there everywhere). A 4-head drafter's chains stop at depth 4."""
    from gumiho.static_tree import choices_for
    from gumiho.tree import TreeSettings, build_tree

    target, data = corpus
    seq = load_sequences(data)[0]
    drafter = random_drafter(kind, target, scale=0.2).attach(target.embed_weight, target.head_weight)
    predicted, labels, _ = chain_predictions(drafter, target, seq)
    assert predicted.shape[1] == labels.shape[1] == 4
    ids, f = seq.input_ids, seq.features.float()
    paths = choices_for(kind, 4)
    for i in (3, 10):
        pool = drafter.propose(f[: i + 1], ids[1: i + 2], TreeSettings(top_k=10, depth=4, total_tokens=64))
        tree = build_tree(int(ids[i + 1]), pool, 64)
        top = [int(tree.tokens[paths.index((0,) * d) + 1]) for d in range(1, 5)]
        assert predicted[i, 0].item() == top[0]
        for k in range(1, 4):
            assert top[k] == _best(drafter, f[i], [int(ids[i + 1]), *top[:k]])  # drafting reads its own path
            chain = _best(drafter, f[i], [int(ids[i + 1]), *labels[i, :k].tolist()])  # the chain: greedy tokens
            assert predicted[i, k].item() == chain
            if kind == "medusa":
                assert chain == top[k]
    accuracy = chain_accuracy(drafter, target, [seq])
    assert len(accuracy) == 4 and accuracy == sorted(accuracy, reverse=True)


def _best(drafter, feature: torch.Tensor, following: list[int]) -> int:
    """The best token of the head that follows `following` (the root and the draft tokens before it)."""
    with torch.no_grad():
        predicted = drafter.predict(feature[None], torch.tensor([following]), len(following) - 1)
    return drafter.top_tokens(predicted, 1)[1].item()


def test_fine_tune_from_a_drafter_with_unrolled_steps(corpus, tmp_path):
    target, data = corpus
    first = train(_config("gumiho", data, tmp_path / "a", epochs=1), target)
    run = train(_config("gumiho", data, tmp_path / "b", epochs=2, draft_vocab=8, unroll=2,
                        init=str(first / "drafter")), target)
    summary = json.loads((run / "train.json").read_text())
    assert "acc2" in summary["final"] and summary["draft_vocab_size"] == 16  # the init drafter's vocabulary
    start, tuned = Drafter.from_pretrained(first / "drafter"), Drafter.from_pretrained(run / "drafter")
    assert torch.equal(start.draft_vocab, tuned.draft_vocab)
    assert not torch.equal(start.transformer.fc.weight, tuned.transformer.fc.weight)
    card = ship(run, tmp_path / "shipped").joinpath("README.md").read_text()
    assert "Training-time test: 2 draft steps" in card
    first_tokens = json.loads((first / "train.json").read_text())["tokens_seen"]  # no card in a run folder
    assert "Cumulative tokens seen (this run and the drafters it started from): unknown" in card
    ship(first, tmp_path / "lineage")  # the initial drafter shipped, then fine-tuned from and shipped over itself
    again = train(_config("gumiho", data, tmp_path / "e", epochs=1, init=str(tmp_path / "lineage")), target)
    card = ship(again, tmp_path / "lineage").joinpath("README.md").read_text()
    total = first_tokens + json.loads((again / "train.json").read_text())["tokens_seen"]
    assert f"Cumulative tokens seen (this run and the drafters it started from): {total:,} ({first_tokens:,} " in card
    with pytest.raises(GumihoError, match="is a gumiho drafter"):
        train(_config("eagle2", data, tmp_path / "c", init=str(first / "drafter")), target)
    with pytest.raises(GumihoError, match="unroll"):
        train(_config("eagle2", data, tmp_path / "d", unroll=0), target)


def test_fine_tune_grows_the_heads_of_a_medusa_drafter(corpus, tmp_path):
    """--init with --blocks: the initial heads' blocks come first and the new ones train from the identity."""
    target, data = corpus
    first = train(_config("medusa", data, tmp_path / "a", epochs=1), target)
    run = train(_config("medusa", data, tmp_path / "b", epochs=1, blocks=3, init=str(first / "drafter")), target)
    start, grown = Drafter.from_pretrained(first / "drafter"), Drafter.from_pretrained(run / "drafter")
    assert (start.config.mlp_blocks, grown.config.mlp_blocks) == (1, 3)
    assert grown.heads.block_weight[:, 1:].abs().sum() > 0  # the added blocks left the identity
    assert "Residual blocks per head: 3 (blocks the initial drafter lacked started as the identity)" in \
        ship(run, tmp_path / "shipped").joinpath("README.md").read_text()
    with pytest.raises(GumihoError, match="--blocks applies to medusa and hydra, not eagle2"):
        train(_config("eagle2", data, tmp_path / "c", blocks=2), target)


def test_bf16_autocast_trains_fp32_weights_with_fp32_losses(corpus, tmp_path, monkeypatch):
    from gumiho.train import precision

    target, data = corpus
    runs = {mode: json.loads((train(_config("gumiho", data, tmp_path / mode, epochs=2, autocast=mode), target)
                              / "train.json").read_text()) for mode in ("off", "bf16")}
    off, bf16 = (runs[m]["history"][-1]["loss"] for m in ("off", "bf16"))
    assert torch.isfinite(torch.tensor(bf16)) and bf16 != off  # bf16 matmuls, so not bit-identical
    assert abs(bf16 - off) < 0.1 * abs(off)
    drafter = Drafter.from_pretrained(tmp_path / "bf16" / "drafter")
    assert all(p.dtype == torch.float32 for p in drafter.parameters())
    monkeypatch.setattr(precision, "bf16_units", lambda device: "")
    assert not precision.uses_bf16(torch.device("cpu"), "auto") and precision.uses_bf16(torch.device("cpu"), "bf16")
    monkeypatch.setattr(precision, "bf16_units", lambda device: "AMX")
    assert precision.uses_bf16(torch.device("cpu"), "auto") and not precision.uses_bf16(torch.device("cpu"), "off")
    with pytest.raises(GumihoError, match="--autocast must be one of"):
        precision.uses_bf16(torch.device("cpu"), "fp8")
