"""The lean Llama forward against transformers' own: same features, same greedy tokens, same KV bookkeeping."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from gumiho import kernels
from gumiho.engine import Engine, GenerationConfig
from gumiho.errors import GumihoError
from gumiho.target import Target
from gumiho.train.distill import greedy_replies

from .conftest import tiny_tokenizer

VOCAB = 24


def twin_targets(seed: int = 0, **config) -> tuple[Target, Target]:
    """The same random Llama behind the lean forward and behind transformers' forward."""
    torch.manual_seed(seed)
    base = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=False)
    model = LlamaForCausalLM(LlamaConfig(**{**base, **config})).eval().requires_grad_(False)
    with torch.no_grad():
        for p in model.parameters():  # biases start at zero; randomise them so that they matter
            if p.dim() == 1 and p.abs().sum() == 0:
                p.normal_(0, 0.1)
    make = lambda forward: Target(model=model, tokenizer=tiny_tokenizer(VOCAB), name="tiny", device=torch.device("cpu"),
                                  dtype=torch.float32, forward=forward)
    reference = make("transformers")
    return make("lean"), reference


CONFIGS = {
    "gqa": {},
    "mha": {"num_key_value_heads": 4},
    "mqa": {"num_key_value_heads": 1},
    "heads of 64": {"hidden_size": 256},  # a prompt's attention through kernels/prompt_attention.cpp where built
    "qkv bias": {"attention_bias": True},
    "llama3 rope": {"rope_parameters": {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0,
                                        "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                        "original_max_position_embeddings": 64}},
}


@pytest.mark.parametrize("name", CONFIGS)
def test_prefill_tree_and_compaction_match_transformers(name):
    lean, ref = twin_targets(**CONFIGS[name])
    if name == "heads of 64" and kernels.prompt_attention() is not None:
        assert lean._lean.prompt_kernel is not None  # the prompt's attention is the block kernel's
    with torch.inference_mode():
        check_prefill_tree_and_compaction(lean, ref)


def check_prefill_tree_and_compaction(lean: Target, ref: Target) -> None:
    prefix = torch.randint(VOCAB, (90,), generator=torch.Generator().manual_seed(1))  # positions past 64: rope scaling
    caches = lean.new_cache(), ref.new_cache()
    a, b = (t.features(prefix, c, prefill=True) for t, c in zip((lean, ref), caches))  # causal: `_causal`'s
    torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(lean.features(prefix, lean.new_cache()), a, rtol=1e-4, atol=1e-5)  # the mask's
    # A tree: root -> {1, 2}, 1 -> 3; positions are depths.
    tokens, depths = torch.tensor([5, 7, 9, 11]), torch.tensor([0, 1, 1, 2])
    tree = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]], dtype=torch.bool)
    mask = torch.cat([torch.ones(4, 90, dtype=torch.bool), tree], 1)[None, None]
    a, b = (t.features(tokens, c, depths + 90, mask) for t, c in zip((lean, ref), caches))
    torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    from gumiho.kv import keep_accepted

    for cache in caches:
        keep_accepted(cache, 90, torch.tensor([0, 1, 3]))
        assert cache.get_seq_length() == 93
    a, b = (t.features(torch.tensor([3]), c) for t, c in zip((lean, ref), caches))
    torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_the_cache_grows_past_its_capacity():
    lean, ref = twin_targets()
    with torch.inference_mode():
        check_growth(lean, ref)


def check_growth(lean: Target, ref: Target) -> None:
    cache = lean._lean.new_cache(capacity=8)
    ids = torch.randint(VOCAB, (30,), generator=torch.Generator().manual_seed(2))
    lean.features(ids[:5], cache)
    for i in range(5, 30):  # one token at a time, past two doublings
        last = lean.features(ids[i : i + 1], cache)
    assert cache.capacity >= 30 and cache.get_seq_length() == 30
    torch.testing.assert_close(last[-1], ref.features(ids, ref.new_cache())[-1], rtol=1e-4, atol=1e-5)


def test_greedy_ar_equals_transformers_generate():
    lean, ref = twin_targets(seed=3)
    ids = [1, 4, 9, 16, 2]
    trace = Engine(lean).generate("", "ar", GenerationConfig(max_new_tokens=40), prompt_ids=ids)
    out = ref.model.generate(torch.tensor([ids]), max_new_tokens=40, do_sample=False, eos_token_id=None,
                             pad_token_id=0, min_new_tokens=40)
    assert trace.token_ids == out[0, len(ids):].tolist()


PROMPTS = [[1, 4, 9], [2, 5, 7, 11, 13, 6, 20], [8], [5, 5, 6, 7, 10]]


def test_a_left_padded_batch_gives_each_sequence_its_own_features():
    lean, _ = twin_targets(seed=4)
    width = max(map(len, PROMPTS))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in PROMPTS])
    valid = ids.new_tensor([[False] * (width - len(p)) + [True] * len(p) for p in PROMPTS], dtype=torch.bool)
    positions = (torch.arange(width) - (~valid).sum(1, keepdim=True)).clamp(min=0)
    mask = torch.ones(width, width, dtype=torch.bool).tril() & valid[:, None] | torch.eye(width, dtype=torch.bool)
    with torch.inference_mode():
        batched = lean.lean.forward(ids, positions, lean.lean.new_cache(batch=len(PROMPTS)), mask)
        for row, prompt in enumerate(PROMPTS):
            alone = lean.features(torch.tensor(prompt), lean.new_cache())
            torch.testing.assert_close(batched[row, width - len(prompt):], alone, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("forward", ["lean", "transformers"])
def test_batched_greedy_replies_equal_one_prompt_at_a_time(forward):
    """Self-distillation's batches: every reply equals transformers' greedy generate on its prompt alone, cut after
    the end-of-turn token; rows that end early leave the batch while the others go on."""
    lean, ref = twin_targets(seed=5)
    target = lean if forward == "lean" else ref
    alone = lambda p, eos: ref.model.generate(torch.tensor([p]), max_new_tokens=12, do_sample=False, pad_token_id=0,
                                              eos_token_id=eos)[0, len(p):].tolist()
    free = [alone(p, None) for p in PROMPTS]
    eos = free[0][4]  # prompt 0's fifth token ends its reply early
    expected = [r[: r.index(eos) + 1] if eos in r else r for r in free]
    assert len(expected[0]) < 12 and any(len(r) == 12 for r in expected)
    target.eos_ids = {eos}
    assert greedy_replies(target, PROMPTS, max_new_tokens=12, batch_size=4) == expected


def test_self_distillation_under_bf16_autocast_takes_torchs_operations():
    """bf16 autocast (self-distillation on a CPU with bf16 units) makes the products return bf16 rows, which the
    row kernels (fp32 only) do not take: a forward under it takes torch's operations, with or without the kernels."""
    lean, _ = twin_targets(seed=6, hidden_size=64)  # head size 16: the row-consistent kernels apply
    assert lean.lean.row_attention is not None
    with torch.autocast("cpu", dtype=torch.bfloat16):
        replies = greedy_replies(lean, PROMPTS, max_new_tokens=6, batch_size=4)
        kernels = lean.lean.row_attention, lean.lean.row_ops
        lean.lean.row_attention = lean.lean.row_ops = None
        try:
            assert greedy_replies(lean, PROMPTS, max_new_tokens=6, batch_size=4) == replies
        finally:
            lean.lean.row_attention, lean.lean.row_ops = kernels
    assert [len(r) for r in replies] == [6] * len(PROMPTS)


def test_unsupported_model_types_fall_back_to_transformers():
    lean, _ = twin_targets()
    lean.model.config.model_type = "gpt_neox"
    fallback = Target(model=lean.model, tokenizer=lean.tokenizer, name="x", device=torch.device("cpu"),
                      dtype=torch.float32)
    assert fallback.forward == "transformers"
    with pytest.raises(GumihoError, match="unknown forward"):
        Target(model=lean.model, tokenizer=lean.tokenizer, name="x", device=torch.device("cpu"),
               dtype=torch.float32, forward="fast")


def test_default_model_greedy_ar_equals_transformers_generate(smollm):
    target = smollm.target
    ids = target.encode_prompt("Name three primary colours.")
    trace = smollm.generate("", "ar", GenerationConfig(max_new_tokens=24), prompt_ids=ids)
    out = target.model.generate(torch.tensor([ids]), max_new_tokens=24, do_sample=False)
    assert trace.token_ids == out[0, len(ids):].tolist()[: len(trace.token_ids)]
