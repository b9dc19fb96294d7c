"""The int4 path: GGUF Q4_1 blocks read as stored, 4-bit products that equal their dequantized weights, rows
computed alike whatever their number, and greedy speculation that equals this path's own AR token for token."""

from __future__ import annotations

import json
import types

import numpy as np
import pytest
import torch

from gumiho import int4
from gumiho.bench.machine import describe
from gumiho.engine import Engine, GenerationConfig
from gumiho.int4 import GROUP, Int4Matrix, int4_available, unpack_q4_1
from gumiho.llama import BF16_TILES, PREFILL_REPEATS, PREFILL_ROWS, CausalAttention, LeanLlama
from gumiho.tiles import TileMatrix, tiles_available
from gumiho.profile import ExecPath, candidate_paths, prefill_path, target_for
from gumiho.tree import TreeSettings

from .conftest import random_drafter, tiny_target, use_cache

pytestmark = pytest.mark.skipif(not int4_available(), reason="this torch has no CPU int4 kernel")


def q4_1_row(d: float, m: float, values: list[int]) -> np.ndarray:
    """One Q4_1 block as llama.cpp writes it: fp16 d, fp16 m, byte j = value j | value j + 16 << 4."""
    low, high = np.array(values[:16], np.uint8), np.array(values[16:], np.uint8)
    head = np.array([d, m], np.float16).view(np.uint8)
    return np.concatenate([head, low | (high << 4)])


def test_q4_1_blocks_unpack_to_d_q_plus_m():
    values = [(7 * i + 3) % 16 for i in range(32)]
    rows = np.stack([np.concatenate([q4_1_row(0.5, -1.0, values), q4_1_row(0.25, 2.0, values[::-1])]),
                     np.concatenate([q4_1_row(1.0, 0.0, values[::-1]), q4_1_row(2.0, -8.0, values)])])
    q, d, m = unpack_q4_1(rows)
    assert q.shape == (2, 64) and d.tolist() == [[0.5, 0.25], [1.0, 2.0]] and m.tolist() == [[-1.0, 2.0], [0.0, -8.0]]
    assert q[0, :32].tolist() == values and q[0, 32:].tolist() == values[::-1]
    matrix = Int4Matrix.from_q4_1(rows)
    expected = (q.float().view(2, 2, GROUP) * d[..., None] + m[..., None]).view(2, 64)
    assert torch.equal(matrix.dequantized(), expected)  # these scales and zeros are exact in bf16


def test_products_equal_the_dequantized_weight_and_rows_do_not_depend_on_their_number():
    torch.manual_seed(0)
    weight = torch.randn(96, 128)
    matrix = Int4Matrix.quantize(weight, bias=torch.randn(96))
    dequantized = matrix.dequantized()
    assert (dequantized - weight).abs().max() <= (weight.abs().max() * 2 / 15) * 0.51 + 1e-2  # half a step, bf16
    x = torch.randn(7, 128)
    y = matrix(x)
    reference = x.bfloat16().float() @ dequantized.t() + matrix.bias
    assert (y - reference).abs().max() <= 0.01 * reference.abs().max()  # bf16 activations and output
    for i in range(7):
        assert torch.equal(matrix(x[i : i + 1])[0], y[i])  # a tree row equals a one-token step, bit for bit
    assert matrix(x[None])[0].shape == (7, 96)


def tiny_int4_engine(seed: int) -> Engine:
    target = target_for(tiny_target(seed=seed, vocab=16), ExecPath("int4", pack=False))
    engine = Engine(target)
    for kind in ("eagle2", "gumiho"):
        engine.add_drafter(kind, random_drafter(kind, target, seed))
    return engine


def test_greedy_speculation_equals_int4_ar_on_tiny_models():
    accepted = 0
    shapes = {"eagle2": TreeSettings(top_k=4, depth=5, total_tokens=24),
              "gumiho": TreeSettings(top_k=4, depth=6, total_tokens=24, mlptopk=6, pruning=6)}
    for seed in range(6):
        engine = tiny_int4_engine(seed)
        assert engine.target.int4 and engine.target.precision == "int4"
        ids = torch.randint(0, 16, (9,), generator=torch.Generator().manual_seed(seed)).tolist()
        ar = engine.generate("", "ar", GenerationConfig(max_new_tokens=30), prompt_ids=ids)
        assert ar.settings.dtype == "int4"
        for method, tree in shapes.items():
            run = engine.generate("", method, GenerationConfig(max_new_tokens=30, tree=tree), prompt_ids=ids)
            assert run.token_ids == ar.token_ids, (seed, method)
            accepted += sum(s.accept_length for s in run.steps)
    assert accepted > 20  # drafts were accepted, so the comparison covered multi-token cycles


def test_without_the_kernels_the_head_is_fp16_and_speculation_still_equals_ar(monkeypatch):
    """GUMIHO_KERNELS=0 (or no compiler): the head falls back to an fp16 product read one row at a time, and on a
    tiny model (where no near-tie is at stake) greedy speculation still equals int4 AR."""
    import gumiho.target
    from gumiho.int4 import CastMatrix

    monkeypatch.setattr(gumiho.target, "q8_matmul", lambda: None)
    engine = tiny_int4_engine(0)
    assert isinstance(engine.target._head, CastMatrix) and not engine.target.head_batches
    ids = list(range(2, 11))
    ar = engine.generate("", "ar", GenerationConfig(max_new_tokens=20), prompt_ids=ids)
    run = engine.generate("", "gumiho", GenerationConfig(max_new_tokens=20), prompt_ids=ids)
    assert run.token_ids == ar.token_ids


FP32_ATTENTION = CausalAttention(torch.float32)
BF16_ATTENTIONS = [CausalAttention(torch.bfloat16, way) for way in ("kernel", "sdpa", "amx")]


@pytest.mark.parametrize("dtype, attention, within", [(torch.float32, FP32_ATTENTION, 1e-4),
                                                      (torch.bfloat16, FP32_ATTENTION, 3e-2),
                                                      *((torch.bfloat16, bf16, 3e-2) for bf16 in BF16_ATTENTIONS),
                                                      (BF16_TILES, FP32_ATTENTION, 3e-2),
                                                      (BF16_TILES, BF16_ATTENTIONS[-1], 3e-2)])
def test_a_long_prompt_prefills_through_the_float_weights_and_speculation_still_follows_ar(monkeypatch, dtype,
                                                                                          attention, within):
    """Where the machine measures float products faster for many rows, the prompt takes them: its features are
    those of the model's float weights (close to, not equal to, the 4-bit ones; in bf16, to bf16 rounding, its causal
    attention in bf16 too where that is measured faster; bf16 packed for AMX tiles where the machine has them), and
    since AR and speculation share the prefill, greedy speculation still equals this path's AR."""
    if dtype == BF16_TILES and not tiles_available():
        pytest.skip("no AMX tiles here (the processor, the build or the OS)")
    monkeypatch.setattr(LeanLlama, "_prefill_choice", lambda self, first, file: (dtype, PREFILL_ROWS[0], attention))
    engine = tiny_int4_engine(3)
    target = engine.target
    tiles = dtype == BF16_TILES
    assert target.lean.prefill_layers is not None and target.lean.prefill_tiles == tiles
    assert target.lean.prefill_dtype == (torch.bfloat16 if tiles else dtype)
    if tiles:  # every product of the tiny model fits the tiles; the MLP's as one gated product
        assert all(isinstance(m, TileMatrix) for layer in target.lean.prefill_layers
                   for m in (layer.qkv, layer.o, layer.gate_up, layer.down))
        assert target.lean.prefill_layers[0].gate_up.gated
    ids = torch.randint(0, 16, (PREFILL_ROWS[0] + 16,), generator=torch.Generator().manual_seed(3))
    as_prefill = target.features(ids, target.new_cache(), prefill=True)
    if attention != FP32_ATTENTION:  # the attention's own rounding shows
        target.lean.prefill_attention = FP32_ATTENTION
        assert not torch.equal(as_prefill, target.features(ids, target.new_cache(), prefill=True))
        target.lean.prefill_attention = attention
    as_tree = target.features(ids, target.new_cache())
    fp32 = target_for(engine.target, ExecPath("float32", pack=False)).features(ids, target.new_cache())
    assert not torch.equal(as_prefill, as_tree)
    assert (as_prefill - fp32).abs().max() < within
    if dtype == torch.float32:
        assert (as_tree - fp32).abs().max() > within
    short = ids[: PREFILL_ROWS[0] - 1]  # a short prompt stays on the 4-bit products
    assert torch.equal(target.features(short, target.new_cache(), prefill=True),
                       target.features(short, target.new_cache()))
    ar = engine.generate("", "ar", GenerationConfig(max_new_tokens=30), prompt_ids=ids.tolist())
    for method, tree in {"eagle2": TreeSettings(top_k=4, depth=5, total_tokens=24),
                         "gumiho": TreeSettings(top_k=4, depth=6, total_tokens=24, mlptopk=6, pruning=6)}.items():
        run = engine.generate("", method, GenerationConfig(max_new_tokens=30, tree=tree), prompt_ids=ids.tolist())
        assert run.token_ids == ar.token_ids, method


@pytest.mark.parametrize("bf16", BF16_ATTENTIONS, ids=lambda attention: attention.name)
def test_a_prompt_on_the_4_bit_products_may_take_a_bf16_attention_and_speculation_still_follows_ar(monkeypatch, bf16):
    """Where no float weights beat 4 bits but a bf16 causal attention is measured faster, every prompt keeps the
    4-bit products and takes that attention, the drafters' passes over it too (no float weights for them either);
    AR and speculation share the prefill, so greedy speculation still equals this path's AR."""
    monkeypatch.setattr(LeanLlama, "_prefill_choice", lambda self, first, file: (None, 0, bf16))
    engine = tiny_int4_engine(5)
    lean = engine.target.lean
    assert lean.prefill_layers is None and lean.prompt_layers(3) == (lean.layers, bf16)
    for kind in ("eagle2", "gumiho"):
        stack = engine.drafters[kind].lean
        assert stack.prefill_layers is None and stack.prompt_layers(3) == (stack.layers, bf16), kind
    ids = torch.randint(0, 16, (40,), generator=torch.Generator().manual_seed(5))
    as_prefill = engine.target.features(ids, engine.target.new_cache(), prefill=True)
    lean.prefill_attention = None  # the stack's fp32
    in_fp32 = engine.target.features(ids, engine.target.new_cache(), prefill=True)
    lean.prefill_attention = bf16
    assert not torch.equal(as_prefill, in_fp32) and (as_prefill - in_fp32).abs().max() < 3e-2
    ar = engine.generate("", "ar", GenerationConfig(max_new_tokens=30), prompt_ids=ids.tolist())
    for method, tree in {"eagle2": TreeSettings(top_k=4, depth=5, total_tokens=24),
                         "gumiho": TreeSettings(top_k=4, depth=6, total_tokens=24, mlptopk=6, pruning=6)}.items():
        run = engine.generate("", method, GenerationConfig(max_new_tokens=30, tree=tree), prompt_ids=ids.tolist())
        assert run.token_ids == ar.token_ids, method


@pytest.mark.parametrize("attention", [FP32_ATTENTION, *BF16_ATTENTIONS], ids=lambda attention: attention.name)
def test_a_bf16_prefill_hands_its_rows_over_in_bf16_with_the_numbers_of_casts(monkeypatch, attention):
    """A prompt through bf16 weights passes bf16 rows between its products and the per-row kernels (norms, gated
    product, rotary) instead of casting before and after each product: the features and the cache it leaves are the
    casts' bit for bit. (A model whose heads the row kernels take: 16 wide.)"""
    from transformers import LlamaConfig, LlamaForCausalLM

    monkeypatch.setattr(LeanLlama, "_prefill_choice",
                        lambda self, first, file: (torch.bfloat16, PREFILL_ROWS[0], attention))
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=16, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
    lean = LeanLlama(LlamaForCausalLM(config).eval(), int4={})
    assert lean.row_ops is not None and lean.prefill_dtype == torch.bfloat16
    ids = torch.randint(0, 16, (PREFILL_ROWS[0] + 20,), generator=torch.Generator().manual_seed(1))
    positions = torch.arange(len(ids))
    handed_over, ops = [], lean.row_ops

    class Recorded:  # the norms' calls, to see that they did round to bf16
        def __getattr__(self, name):
            return getattr(ops, name)

        def rms_norm(self, x, weight, eps, bf16=False):
            handed_over.append(bf16)
            return ops.rms_norm(x, weight, eps, bf16)

    lean.row_ops = Recorded()
    with torch.inference_mode():
        runs = []
        for dtype in (torch.bfloat16, None):  # None: the same bf16 weights, casts around each product
            lean.prefill_dtype, cache = dtype, lean.new_cache()
            features = lean.forward(ids, positions, cache, prefill=True)
            runs.append((features, cache.keys[..., : len(ids), :].clone(), cache.values[..., : len(ids), :].clone()))
    assert True in handed_over and False in handed_over
    for ours, casts in zip(*runs):
        assert torch.equal(ours, casts)
    assert runs[0][0].dtype == torch.float32


@pytest.mark.parametrize("dtype, within", [(torch.float32, 1e-5), (torch.bfloat16, 1e-2)])
def test_a_drafters_pass_over_a_long_prompt_takes_the_targets_prefill_weights(monkeypatch, dtype, within):
    """A drafter's first cycle runs its layers over the whole prompt: from the target's `prefill_from` tokens on,
    that pass takes the float weights in the target's prefill dtype too, so its output is the drafter modules' own
    (to float or bf16 rounding, relative to its largest value), not the 4-bit products'; a shorter prompt stays on
    the 4-bit products."""
    monkeypatch.setattr(LeanLlama, "_prefill_choice", lambda self, first, file: (dtype, PREFILL_ROWS[0],
                                                                                FP32_ATTENTION))
    engine = tiny_int4_engine(4)
    target = engine.target
    ids = torch.randint(0, 16, (PREFILL_ROWS[0] + 8,), generator=torch.Generator().manual_seed(4))
    features = target.features(ids, target.new_cache(), prefill=True)
    tokens = torch.cat([ids[1:], ids[:1]])
    for kind in ("eagle2", "gumiho"):
        drafter = engine.drafters[kind]
        assert drafter.lean.prefill_layers is not None and drafter.lean.prefill_from == PREFILL_ROWS[0]

        def last_output(n: int) -> torch.Tensor:
            drafter.reset()
            return drafter.advance(features[:n], tokens[:n])

        def error(output: torch.Tensor, n: int) -> float:  # against the drafter's float modules, as training runs them
            with torch.no_grad():
                fused = drafter.transformer.fuse(drafter.embed(tokens[:n]), features[:n])
                reference = drafter.transformer(fused[None], torch.arange(n), None, None)[0, -1]
            return ((output - reference).abs().max() / reference.abs().max()).item()

        long, short = len(ids), PREFILL_ROWS[0] - 1
        assert error(last_output(long), long) < within, kind
        prompt_layers, drafter.lean.prefill_layers = drafter.lean.prefill_layers, None
        four_bit_long, four_bit_short = last_output(long), last_output(short)
        drafter.lean.prefill_layers = prompt_layers
        assert torch.equal(last_output(short), four_bit_short), kind
        if dtype == torch.float32:
            assert error(four_bit_long, long) > within, kind


def test_a_prompt_takes_the_float_weights_from_where_they_beat_4_bits():
    from gumiho.llama import prefill_choice

    bf16, fp32 = torch.bfloat16, torch.float32
    # The Zen 4 EPYC's whole prefills (ms) at 64 and 256 tokens: bf16 wins from about 90 tokens
    crossing = prefill_choice({None: (58.6, 313.8), fp32: (137.2, 442.0), bf16: (72.5, 226.6)})
    assert crossing[0] == bf16 and 85 <= crossing[1] <= 95
    assert prefill_choice({None: (90.0, 400.0), fp32: (60.0, 200.0), bf16: (70.0, 250.0)}) == (fp32, PREFILL_ROWS[0])
    assert prefill_choice({None: (50.0, 200.0), fp32: (60.0, 210.0), bf16: (70.0, 250.0)}) == (None, 0)


def test_the_prefill_choice_is_measured_once_per_machine_and_model_then_read(monkeypatch, tmp_path):
    """The choice changes a long prompt's numerics and so its greedy text: every process on a machine must make the
    same one. The first load measures and writes it; the next ones read it; a damaged file is measured again."""
    use_cache(monkeypatch, tmp_path)
    measured = []

    def fastest(self, first):
        measured.append(first)
        return torch.bfloat16, 90, sdpa

    sdpa = CausalAttention(torch.bfloat16, "sdpa")
    monkeypatch.setattr(LeanLlama, "_fastest_prefill", fastest)
    lean = tiny_int4_engine(0).target.lean
    assert (lean.prefill_dtype, lean.prefill_from, len(measured)) == (torch.bfloat16, 90, 1)
    target = tiny_int4_engine(0).target  # a later load of the same model on the same machine
    assert (target.lean.prefill_dtype, target.lean.prefill_from, len(measured)) == (torch.bfloat16, 90, 1)
    assert prefill_choices(target) == {"dtype": "bfloat16", "from": 90, "attention": "bfloat16-sdpa"}
    assert target.lean.prefill_attention == sdpa
    prefill_path(target).write_text("{damaged")
    lean = tiny_int4_engine(0).target.lean
    assert (lean.prefill_dtype, len(measured)) == (torch.bfloat16, 2)
    for attention in (None, "bfloat16-flash"):  # an older file without an attention, or one this version lacks
        prefill_path(target).write_text(json.dumps({"dtype": "bfloat16", "from": 90, "attention": attention}))
        lean = tiny_int4_engine(0).target.lean
        assert lean.prefill_attention == sdpa
    assert len(measured) == 4
    assert prefill_choices(target) == {"dtype": "bfloat16", "from": 90, "attention": "bfloat16-sdpa"}
    prefill_path(target).write_text(json.dumps({"dtype": "int4", "from": 0, "attention": "bfloat16"}))
    assert tiny_int4_engine(0).target.lean.prefill_attention == CausalAttention(torch.bfloat16)  # read, as named
    assert len(measured) == 4


def test_where_the_machine_has_amx_tiles_they_are_a_prefill_candidate_remembered_by_name(monkeypatch, tmp_path):
    """The load times bf16 weights packed for the tiles beside the 4-bit, fp32 and oneDNN bf16 ones; where they win,
    the prompt's layers are TileMatrix products (the MLP's a gated one), the file names them, and a later load
    builds them again from the file without measuring."""
    if not tiles_available():
        pytest.skip("no AMX tiles here (the processor, the build or the OS)")
    use_cache(monkeypatch, tmp_path)
    timed = []

    def choose(times):
        timed.append(set(times))
        return BF16_TILES, PREFILL_ROWS[0]

    monkeypatch.setattr("gumiho.llama.prefill_choice", choose)
    for load in range(2):
        lean = tiny_int4_engine(0).target.lean
        assert lean.prefill_tiles and lean.prefill_dtype == torch.bfloat16 and lean.prefill_from == PREFILL_ROWS[0]
        layer = lean.prefill_layers[0]
        assert all(isinstance(m, TileMatrix) for m in (layer.qkv, layer.o, layer.gate_up, layer.down))
        assert layer.gate_up.gated and not layer.qkv.gated
    assert timed == [{None, torch.float32, torch.bfloat16, BF16_TILES}]  # measured once, every candidate
    assert json.loads(prefill_path(tiny_int4_engine(0).target).read_text())["dtype"] == BF16_TILES


def test_token_recycling_fills_its_table_from_the_prompt_on_the_tiles_where_the_prompts_take_them(monkeypatch):
    """Token Recycling puts up to 512 prompt rows through the lm_head after the prefill: where the target's prompts
    take bf16 products on AMX tiles, through a tile copy of the head (`prompt_head`), whose table is the fp32 head's
    to bf16 rounding (the same next tokens almost everywhere); greedy recycling still equals AR. Elsewhere, the fp32
    head as before."""
    from gumiho.drafters import weight_free

    if not tiles_available():
        pytest.skip("no AMX tiles here (the processor, the build or the OS)")
    tables = {}
    for weights in (torch.bfloat16, BF16_TILES):
        monkeypatch.setattr(LeanLlama, "_prefill_choice", lambda self, first, file, w=weights: (w, PREFILL_ROWS[0],
                                                                                               FP32_ATTENTION))
        target = target_for(tiny_target(seed=5, vocab=64), ExecPath("int4", pack=False))
        engine = Engine(target)
        engine.add_drafter("recycle", weight_free("recycle", target.model.config))
        drafter = engine.drafters["recycle"]
        assert isinstance(drafter.prompt_head, TileMatrix) == (weights == BF16_TILES)
        ids = torch.randint(0, 64, (PREFILL_ROWS[0] + 60,), generator=torch.Generator().manual_seed(5))
        drafter.reset()
        drafter.observe(ids, target.features(ids, target.new_cache(), prefill=True))
        tables[weights] = drafter.next_ids[:, 0].clone()
        ar = engine.generate("", "ar", GenerationConfig(max_new_tokens=40), prompt_ids=ids.tolist())
        run = engine.generate("", "recycle", GenerationConfig(max_new_tokens=40), prompt_ids=ids.tolist())
        assert run.token_ids == ar.token_ids
    seen = tables[torch.bfloat16] >= 0
    assert torch.equal(seen, tables[BF16_TILES] >= 0) and seen.sum() > 20
    assert (tables[torch.bfloat16][seen] == tables[BF16_TILES][seen]).float().mean() > 0.9


def prefill_choices(target) -> dict:
    """The remembered prefill choice."""
    return json.loads(prefill_path(target).read_text())


def test_how_the_products_ask_for_weights_is_measured_at_every_load(monkeypatch, tmp_path):
    """The distance and whether to keep the weights in the caches are the host's memory system's and change no
    number: each load measures them (one row through every layer's 4-bit products at each setting), and no file
    keeps them."""
    if int4.q4_matmul() is None:
        pytest.skip("our 4-bit kernel does not build here (the setting is its argument)")
    use_cache(monkeypatch, tmp_path)
    monkeypatch.setattr(int4, "AHEAD", int4.AHEAD)  # restored after the test
    monkeypatch.setattr(int4, "KEEP", int4.KEEP)
    measured = []

    def fastest(step, repeats=5):
        step()  # the products it times run
        measured.append(1)
        return (4096 * len(measured), len(measured) == 2), {fetch: 1.0 for fetch in int4.FETCHES}

    monkeypatch.setattr(int4, "fastest_fetch", fastest)
    target = tiny_int4_engine(0).target
    assert (int4.AHEAD, int4.KEEP, len(measured)) == (4096, False, 1)
    assert not {"ahead", "keep"} & set(json.loads(prefill_path(target).read_text()))
    assert target.fetch == "weights streamed, asked for 4 KB ahead"
    target = tiny_int4_engine(0).target  # a later load measures again
    assert (int4.AHEAD, int4.KEEP, len(measured)) == (8192, True, 2)
    # The bench's reports name the setting the run had.
    machine = describe(target.device, target.dtype, target.pack, target.forward, target.int4, target.fetch)
    assert machine["fetch"] == "weights kept in the caches, asked for 8 KB ahead"
    assert machine["description"].endswith(", weights kept in the caches, asked for 8 KB ahead")
    # and the attentions the load chose: decode steps' and trees', and a long prompt's path
    machine = describe(target.device, target.dtype, target.pack, target.forward, target.int4, target.fetch,
                       target.attention, target.prompts)
    assert machine["attention"] == target.attention and machine["prompts"] == target.prompts
    assert machine["description"].endswith(f"8 KB ahead, steps and trees {target.attention}, {target.prompts}")
    assert int4.fetch_text((0, False)) == "weights not asked for ahead"


def timed_fetch(monkeypatch, ms: dict[tuple[int, bool], float]) -> tuple[tuple[int, bool], list]:
    """`int4.fastest_fetch` over a step that takes `ms[setting]` (3 ms for a setting not named) on a clock of the
    test's own, so that the host's noise cannot move the choice."""
    monkeypatch.setattr(int4, "AHEAD", 8192)
    monkeypatch.setattr(int4, "KEEP", False)
    now, seen = [0.0], []
    monkeypatch.setattr(int4, "time", types.SimpleNamespace(perf_counter=lambda: now[0]))

    def step():
        seen.append((int4.AHEAD, int4.KEEP))
        now[0] += ms.get((int4.AHEAD, int4.KEEP), 3.0) / 1e3

    best, medians = int4.fastest_fetch(step, repeats=4)
    assert set(medians) == set(int4.FETCHES)
    assert (int4.AHEAD, int4.KEEP) == (8192, False)  # the caller sets the setting it chose
    return best, seen


def test_the_fastest_setting_is_the_one_whose_products_took_least_and_the_setting_is_restored(monkeypatch):
    best, seen = timed_fetch(monkeypatch, {(16384, False): 0.5})
    assert best == (16384, False)
    assert sorted(seen) == sorted(list(int4.FETCHES) * 8)  # every setting twice in every repeat, the first untimed
    assert all(seen[i] == seen[i + 1] for i in range(0, len(seen), 2))  # a timed step follows one of its own
    assert timed_fetch(monkeypatch, {(4096, True): 0.5})[0] == (4096, True)


def test_keeping_the_weights_in_the_caches_must_win_by_the_margin(monkeypatch):
    """Where keeping saves the products less than KEEP_MARGIN, streaming is kept: it leaves the rest of a cycle's
    data in the caches, which the products alone do not show."""
    close = 3.0 * (1 - int4.KEEP_MARGIN / 2)
    assert timed_fetch(monkeypatch, {(8192, True): close})[0][1] is False
    assert timed_fetch(monkeypatch, {(8192, True): 1.5})[0] == (8192, True)


def test_the_4bit_products_keep_the_prefill_where_they_are_faster(monkeypatch):
    monkeypatch.setattr(LeanLlama, "_prefill_choice", lambda self, first, file: (None, 0, FP32_ATTENTION))
    assert tiny_int4_engine(0).target.lean.prefill_layers is None


@pytest.mark.parametrize("path", ["int4", "float32"])
@pytest.mark.parametrize("kind", ["eagle2", "gumiho"])
def test_the_lean_draft_layers_draft_as_the_modules_do(kind, path):
    """For inference the draft layers run as a llama.DecoderStack (fused q/k/v and gate/up products, a pre-allocated
    cache, the row-consistent attention); 4-bit groups run along the input, so each product is quantized as the
    module's own would be. Two accepted stretches, so the second advance reads the cache the first one wrote."""
    from gumiho.int4 import quantize_linears
    from gumiho.llama import StaticCache

    target = target_for(tiny_target(seed=4, vocab=16), ExecPath(path, pack=False))
    lean = target.prepare_drafter(random_drafter(kind, target, seed=4, scale=1.0))
    assert lean.lean is not None and isinstance(lean.cache, StaticCache)
    modules = random_drafter(kind, target, seed=4, scale=1.0)
    modules.attach(target.embed_weight, target.head_weight, pack=False)
    if path == "int4":
        quantize_linears(modules)
        modules.quantize_head()
    assert modules.lean is None
    features, tokens = torch.randn(8, target.hidden_size), torch.randint(0, 16, (8,))
    tree = TreeSettings(top_k=3, depth=4, total_tokens=12, mlptopk=3, pruning=3)
    pools = []
    for drafter in (lean, modules):
        drafter.reset()
        drafter.propose(features[:5], tokens[:5], tree)
        pools.append(drafter.propose(features[5:], tokens[5:], tree))
        assert drafter.cache.length == 8  # the expansions' keys and values are gone
    for name in ("tokens", "parents"):
        assert all(torch.equal(a, b) for a, b in zip(getattr(pools[0], name), getattr(pools[1], name))), name
    for a, b in zip(pools[0].scores, pools[1].scores):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)


def test_every_dtype_and_int4_are_candidates_on_any_cpu(monkeypatch):
    from gumiho import profile as prof

    monkeypatch.setattr(prof, "cpu_features", lambda: ["avx2", "fma"])  # no bf16 units: measured all the same
    paths = candidate_paths(torch.device("cpu"))
    assert {p.dtype for p in paths} == {"float32", "bfloat16", "float16", "int4"}
    assert [p for p in candidate_paths(torch.device("cpu"), "transformers") if p.dtype == "int4"] == []


@pytest.fixture(scope="module")
def default_blocks():
    from gumiho.errors import GumihoError
    from gumiho.target import default_q4_1_blocks, ensure_default_model

    try:
        folder = ensure_default_model()
    except GumihoError as exc:
        pytest.skip(str(exc))
    from transformers import AutoConfig

    return folder, default_q4_1_blocks(AutoConfig.from_pretrained(folder))


def test_the_default_models_gguf_blocks_are_its_weights(default_blocks):
    """Read as stored (the query and key rows un-permuted as transformers does), the blocks dequantize to exactly
    the weights transformers converted from the same file."""
    from safetensors import safe_open

    folder, blocks = default_blocks
    assert len(blocks) == 30 * 7
    with safe_open(str(folder / "model.safetensors"), "pt") as weights:
        for name in ("model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.k_proj",
                     "model.layers.7.self_attn.v_proj", "model.layers.29.mlp.down_proj"):
            q, d, m = unpack_q4_1(blocks[name])
            dequantized = (q.float().view(q.shape[0], -1, GROUP) * d[..., None] + m[..., None]).view(q.shape)
            assert torch.equal(dequantized, weights.get_tensor(name + ".weight")), name


def test_the_default_models_head_is_made_into_its_own_q8_0_blocks(default_blocks):
    """The tied embedding, stored as Q8_0 in the GGUF, is re-made into 8-bit blocks that dequantize to exactly the
    weight transformers converted: the int4 path's head is the file's own."""
    import shutil

    from safetensors import safe_open

    from gumiho.int4 import Q8Matrix
    from gumiho.kernels import q8_matmul

    if shutil.which("c++") is None:
        pytest.skip("no C++ compiler to build the 8-bit head")
    folder, _ = default_blocks
    with safe_open(str(folder / "model.safetensors"), "pt") as weights:
        embedding = weights.get_tensor("model.embed_tokens.weight")
    assert torch.equal(Q8Matrix(embedding, q8_matmul()).dequantized(), embedding)


def test_greedy_speculation_equals_int4_ar_on_the_default_model(default_blocks):
    """Token for token: the 4-bit products compute each row alike whatever their number, and so does the
    row-consistent attention (kernels/), so a verified tree's rows are bit for bit the one-token steps' features.
    Without that attention (SDPA), rounding could flip a near-tie (docs/design.md §15)."""
    import shutil

    from gumiho.loader import build_engine

    if shutil.which("c++") is None:
        pytest.skip("no C++ compiler to build the row-consistent attention")
    engine = build_engine(threads=2, dtype="int4", trees="default")
    target = engine.target
    assert target.int4 and target.attention.startswith("row-consistent") and target.head_batches
    # a tree with two branches after a prompt: each node's features are those of a one-token step on its path
    prompt = torch.tensor(target.encode_prompt("Name three colours."))
    past = len(prompt)
    tokens, parents = torch.tensor([504, 1848, 2119, 314, 6653]), [-1, 0, 0, 2, 3]
    visible = torch.zeros(len(tokens), past + len(tokens), dtype=torch.bool)
    visible[:, :past] = True
    depth = []
    for i, parent in enumerate(parents):
        visible[i, past + i] = True
        if parent >= 0:
            visible[i, past:] |= visible[parent, past:]
        depth.append(0 if parent < 0 else depth[parent] + 1)
    cache = target.new_cache()
    target.features(prompt, cache, prefill=True)
    tree = target.features(tokens, cache, torch.tensor(depth) + past, visible[None, None])
    for node in range(len(tokens)):
        path = [j for j in range(len(tokens)) if visible[node, past + j]]
        steps = target.new_cache()
        target.features(prompt, steps, prefill=True)
        for j in path:
            step = target.features(tokens[j : j + 1], steps, torch.tensor([past + depth[j]]))
        assert torch.equal(step[0], tree[node]), node
    config = GenerationConfig(max_new_tokens=48, trace=False)
    for prompt in ("List the planets of the solar system in order, one per line.",
                   "Summarise: The council met on Monday. The council approved the new park. The park opens in May."):
        ar = engine.generate(prompt, "ar", config)
        for method in ("eagle2", "gumiho", "lookup", "recycle"):
            run = engine.generate(prompt, method, config)
            assert run.token_ids == ar.token_ids, (prompt, method)
            assert method in ("lookup", "recycle") or run.tau > 1.2  # the shipped drafters are accepted on int4


def test_every_path_is_compared_with_fp32_ar():
    from gumiho.bench.paths import compare_paths

    base = tiny_target(seed=2, vocab=32)
    paths = [ExecPath("float32"), ExecPath("bfloat16"), ExecPath("int4")]
    prompts = [[1, 5, 9, 3], [7, 7, 2, 30, 4, 4]]
    table = compare_paths(base, paths, prompts, max_new_tokens=12).set_index("path")
    assert list(table.index) == ["fp32 lean", "bf16 lean", "int4 lean"]
    fp32 = table.loc["fp32 lean"]
    assert fp32["same_as_first"] == 1.0 and fp32["first_kept"] == 1.0 and fp32["vs_first"] == 1.0
    assert ((table["first_kept"] >= 0) & (table["first_kept"] <= 1)).all()
    assert (table["tokens_per_s"] > 0).all() and (table["perplexity"] >= 1).all()


def test_the_prefill_measurement_names_a_causal_attention(monkeypatch):
    """`_fastest_prefill` times the products, and the causal attention on its own: a prompt that keeps its 4-bit
    products may still take its attention in bf16 (the block kernel's bf16 products where the processor has them,
    or SDPA's)."""
    from gumiho.llama import BF16_TILES, PREFILL_DTYPES, PROMPT_ATTENTIONS

    target = tiny_int4_engine(0).target
    lean, first = target.lean, target.model.model.layers[0]
    weights, start, attention = lean._fastest_prefill(first)
    tiles = (BF16_TILES,) if tiles_available() else ()
    assert weights in (None, *PREFILL_DTYPES, *tiles) and start >= 0 and attention in PROMPT_ATTENTIONS
    monkeypatch.setattr("gumiho.llama.prefill_choice", lambda times: (None, 0))  # the 4-bit products kept
    for measured in PROMPT_ATTENTIONS:
        monkeypatch.setattr(LeanLlama, "_fastest_causal_attention", lambda self, a=measured: a)
        assert lean._fastest_prefill(first) == (None, 0, measured)


@pytest.mark.parametrize("kernel, costs, fastest", [
    ("amx", {"float32": 4, "bfloat16": 3, "bfloat16-sdpa": 2, "bfloat16-amx": 1}, "bfloat16-amx"),  # a Xeon with AMX
    ("amx", {"float32": 4, "bfloat16": 3, "bfloat16-sdpa": 1, "bfloat16-amx": 2}, "bfloat16-sdpa"),
    ("bf16", {"float32": 3, "bfloat16": 2, "bfloat16-sdpa": 1}, "bfloat16-sdpa"),  # the tiles: the kernel's bf16
    ("bf16", {"float32": 3, "bfloat16": 1, "bfloat16-sdpa": 2}, "bfloat16"),
    ("bf16", {"float32": 1, "bfloat16": 2, "bfloat16-sdpa": 3}, "float32"),
    ("fp32", {"float32": 2, "bfloat16-sdpa": 1}, "bfloat16"),  # the kernel has no bf16 products: SDPA's, first named
    (None, {"float32-sdpa": 2, "bfloat16-sdpa": 1}, "bfloat16"),  # not built: SDPA in either dtype
    (None, {"float32-sdpa": 1, "bfloat16-sdpa": 2}, "float32"),
])
def test_the_prompts_attention_is_the_fastest_way_this_machine_has_of_computing_it(monkeypatch, kernel, costs,
                                                                                    fastest):
    """Each way of computing a prompt's causal attention that this machine has is timed, once per repeat, and the
    fastest is taken; two names for the same computation (the tiles where the kernel has none, the kernel's bf16
    where the kernel is not built, or has no bf16 products, is SDPA's) are timed once, as the first of them. A fake
    clock that each call moves on by the cost of what computes it stands in for the machine."""
    lean = tiny_amx_target().lean
    lean.prompt_kernel = None if kernel is None else types.SimpleNamespace(
        bf16_available=lambda: kernel in ("bf16", "amx"), amx_available=lambda: kernel == "amx")
    clock, computed = [0.0], []

    def causal(self, q, keys, values, attention, out_dtype):
        dtype, way = self._runs_as(attention)
        computed.append(str(dtype).removeprefix("torch.") + ("" if way == "kernel" else f"-{way}"))
        clock[0] += costs[computed[-1]]

    monkeypatch.setattr(LeanLlama, "_causal", causal)
    monkeypatch.setattr("gumiho.llama.time.perf_counter", lambda: clock[0])
    assert lean._fastest_causal_attention().name == fastest
    assert {way: computed.count(way) for way in costs} == dict.fromkeys(costs, PREFILL_REPEATS + 1)  # each as often


def test_the_tiles_are_not_a_prompts_way_for_heads_other_than_64_dimensions():
    """The tiles' attention takes heads of 64 dimensions: a model with others falls to the kernel's bf16 products."""
    lean = tiny_int4_engine(0).target.lean
    assert lean.head_dim != 64
    lean.prompt_kernel = types.SimpleNamespace(bf16_available=lambda: True, amx_available=lambda: True)
    assert lean._runs_as(CausalAttention(torch.bfloat16, "amx")) == (torch.bfloat16, "kernel")


def tiny_amx_target(seed: int = 0):
    """A tiny int4 target whose heads have 64 dimensions, as the AMX tiles' attention takes them."""
    return target_for(tiny_target(seed=seed, vocab=16, hidden=256), ExecPath("int4", pack=False))


def test_on_amx_tiles_greedy_speculation_still_equals_int4_ar(monkeypatch, tmp_path):
    """Decode steps and trees in bf16 tile products (`attend(..., amx=True)`, where this machine has AMX) compute
    every row as a one-token step does: greedy speculation equals this path's own AR token for token, over prompts
    and replies that cross several blocks of 32 keys, the cache keeping its key and value tiles."""
    from gumiho.kernels import row_attention

    if row_attention() is None or not row_attention().amx():
        pytest.skip("no AMX tiles here (the processor, the build or the OS)")
    use_cache(monkeypatch, tmp_path)
    accepted = 0
    shapes = {"eagle2": TreeSettings(top_k=4, depth=5, total_tokens=24),
              "gumiho": TreeSettings(top_k=4, depth=6, total_tokens=24, mlptopk=6, pruning=6)}
    for seed in range(3):
        target = tiny_amx_target(seed)
        target.lean.amx_rows = True
        assert target.attention == "row-consistent-amx" and target.new_cache().tiles.shape[-1] == 2 * 64 * 16
        engine = Engine(target)
        for kind in shapes:
            engine.add_drafter(kind, random_drafter(kind, target, seed))
        ids = torch.randint(0, 16, (45,), generator=torch.Generator().manual_seed(seed)).tolist()
        ar = engine.generate("", "ar", GenerationConfig(max_new_tokens=60), prompt_ids=ids)
        for method, tree in shapes.items():
            run = engine.generate("", method, GenerationConfig(max_new_tokens=60, tree=tree), prompt_ids=ids)
            assert run.token_ids == ar.token_ids, (seed, method)
            accepted += sum(s.accept_length for s in run.steps)
    assert accepted > 20  # multi-token cycles were compared


def test_a_prompt_on_amx_tiles_still_leaves_greedy_speculation_equal_to_ar(monkeypatch, tmp_path):
    """A long prompt through bf16 weights with its attention on AMX tiles (the way "bfloat16-amx", where this machine
    has them), the drafters' passes over it too: its numbers are the tiles' own (not SDPA's), within bf16 rounding of
    them, and since AR and speculation share the prefill, greedy speculation still equals this path's AR."""
    from gumiho.kernels import prompt_attention

    if prompt_attention() is None or not prompt_attention().amx_available():
        pytest.skip("no AMX tiles for a prompt here (the processor, the build or the OS)")
    use_cache(monkeypatch, tmp_path)
    tiles, sdpa = CausalAttention(torch.bfloat16, "amx"), CausalAttention(torch.bfloat16, "sdpa")
    monkeypatch.setattr(LeanLlama, "_prefill_choice",
                        lambda self, first, file: (torch.bfloat16, PREFILL_ROWS[0], tiles))
    target = tiny_amx_target(4)
    lean = target.lean
    assert lean._runs_as(tiles) == (torch.bfloat16, "amx") and lean.prompt_layers(PREFILL_ROWS[0])[1] == tiles
    ids = torch.randint(0, 16, (PREFILL_ROWS[0] + 40,), generator=torch.Generator().manual_seed(4))
    on_tiles = target.features(ids, target.new_cache(), prefill=True)
    lean.prefill_attention = sdpa
    by_sdpa = target.features(ids, target.new_cache(), prefill=True)
    lean.prefill_attention = tiles
    assert not torch.equal(on_tiles, by_sdpa)
    assert (on_tiles - by_sdpa).abs().max() < 3e-2
    engine = Engine(target)
    shapes = {"eagle2": TreeSettings(top_k=4, depth=5, total_tokens=24),
              "gumiho": TreeSettings(top_k=4, depth=6, total_tokens=24, mlptopk=6, pruning=6)}
    for kind in shapes:
        engine.add_drafter(kind, random_drafter(kind, target, 4))
        assert engine.drafters[kind].lean.prompt_layers(PREFILL_ROWS[0])[1] == tiles, kind
    ar = engine.generate("", "ar", GenerationConfig(max_new_tokens=40), prompt_ids=ids.tolist())
    for method, tree in shapes.items():
        run = engine.generate("", method, GenerationConfig(max_new_tokens=40, tree=tree), prompt_ids=ids.tolist())
        assert run.token_ids == ar.token_ids, method


@pytest.mark.parametrize("choice, named", [
    ((torch.bfloat16, 90, CausalAttention(torch.bfloat16, "sdpa")),
     "prompts from 90 tokens through bfloat16 weights, their attention bfloat16-sdpa"),
    ((None, 0, CausalAttention(torch.float32)), "prompts through the 4-bit weights, their attention float32{}"),
    ((BF16_TILES, 64, CausalAttention(torch.bfloat16, "sdpa")),
     "prompts from 64 tokens through bfloat16 weights on AMX tiles, their attention bfloat16-sdpa"),
])
def test_a_target_names_how_it_computes_a_long_prompt(monkeypatch, tmp_path, choice, named):
    """The bench's reports say which prompt path a run had (it sets the prompt's numbers and a long prompt's time):
    the float weights' dtype (packed for AMX tiles or not) and from how many tokens, and the way the attention runs
    on this machine (the block kernel where it builds, else SDPA's). Off the int4 path there is no such choice."""
    from gumiho.kernels import prompt_attention

    if choice[0] == BF16_TILES and not tiles_available():
        pytest.skip("no AMX tiles here (the processor, the build or the OS)")
    use_cache(monkeypatch, tmp_path)
    monkeypatch.setattr(LeanLlama, "_prefill_choice", lambda self, first, file: choice)
    target = tiny_amx_target()  # heads of 64 dimensions, which the block kernel takes
    assert target.prompts == named.format("" if prompt_attention() is not None else "-sdpa")
    assert target_for(target, ExecPath("float32", pack=False)).prompts == ""


def test_the_rows_attention_choice_is_measured_once_per_machine_and_model_then_read(monkeypatch, tmp_path):
    """Whether decode steps and trees take the AMX tiles sets the numbers of every greedy text, so every process on
    a machine makes the same choice: the first load measures and writes it, later ones read it, and a name this
    version does not know is measured again."""
    from gumiho.kernels import row_attention

    if row_attention() is None:
        pytest.skip("the attention kernel did not build")
    use_cache(monkeypatch, tmp_path)
    monkeypatch.setattr(row_attention(), "amx", lambda: True)  # the choice is made where AMX is usable
    measured = []
    monkeypatch.setattr(LeanLlama, "_amx_rows_pay", lambda self: measured.append(self) is None)
    target = tiny_amx_target()
    assert target.lean.amx_rows and len(measured) == 1 and prefill_choices(target)["rows"] == "bfloat16-amx"
    assert tiny_amx_target().lean.amx_rows and len(measured) == 1  # read
    prefill_path(target).write_text(json.dumps({**prefill_choices(target), "rows": "float32"}))
    lean = tiny_amx_target().lean
    assert not lean.amx_rows and lean.new_cache().tiles.shape[-1] == 64 * 16 and len(measured) == 1
    prefill_path(target).write_text(json.dumps({**prefill_choices(target), "rows": "bfloat16-flash"}))
    assert tiny_amx_target().lean.amx_rows and len(measured) == 2
    assert prefill_choices(target)["rows"] == "bfloat16-amx"
    assert not tiny_int4_engine(0).target.lean.amx_rows and len(measured) == 2  # heads of 8: never asked


@pytest.mark.parametrize("costs, amx", [
    ({(False, 1): 2, (False, 4): 4, (True, 1): 1, (True, 4): 2}, True),  # the Intel Xeon with AMX
    ({(False, 1): 1, (False, 4): 4, (True, 1): 2, (True, 4): 2}, True),  # a slower step, a faster tree: the sum
    ({(False, 1): 1, (False, 4): 2, (True, 1): 2, (True, 4): 2}, False),
])
def test_the_amx_tiles_are_taken_where_a_step_and_a_tree_take_less_time(monkeypatch, tmp_path, costs, amx):
    """`_amx_rows_pay` times every layer's attention for a decode step and a 4-token tree both ways, taking turns,
    and takes the tiles where the two cost less. A fake clock, moved on by each call's cost, stands in for the
    machine."""
    use_cache(monkeypatch, tmp_path)
    lean = tiny_amx_target().lean
    clock, calls = [0.0], []

    def attend(qkv, cos, sin, keys, values, visible, heads, past, scale, tiles, tiled, layer, amx):
        calls.append((amx, qkv.shape[1]))
        clock[0] += costs[calls[-1]] / len(lean.layers)

    monkeypatch.setattr(lean, "row_attention", types.SimpleNamespace(attend=attend))
    monkeypatch.setattr("gumiho.llama.time.perf_counter", lambda: clock[0])
    assert lean._amx_rows_pay() is amx
    assert {key: calls.count(key) for key in costs} == dict.fromkeys(costs, (PREFILL_REPEATS + 1) * len(lean.layers))
