"""The prompt's causal attention in blocks (gumiho/kernels/prompt_attention.cpp): SDPA's numbers to fp32 rounding,
for any prompt length across the blocks' edges, any group of query heads per KV head, a cached prefix, any thread
count; and the decoder's prefill through it."""

from __future__ import annotations

import shutil

import pytest
import torch
import torch.nn.functional as F

from gumiho import kernels

pytestmark = pytest.mark.skipif(shutil.which("c++") is None, reason="no C++ compiler to build the kernel")


@pytest.fixture(scope="module")
def kernel():
    module = kernels.prompt_attention()
    if module is None and not {"avx2", "fma"} <= kernels._cpu_flags():
        pytest.skip("the block kernel needs AVX2 and FMA")
    assert module is not None, "the kernel did not build (see the warning above)"
    return module


def reference(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, past: int) -> torch.Tensor:
    """SDPA in float64 with a causal mask offset by `past`, laid out as the kernel returns it: [B, n, H * d]."""
    b, h, n, d = q.shape
    visible = torch.ones(n, past + n, dtype=torch.bool).tril(past)
    out = F.scaled_dot_product_attention(q.double(), keys.double(), values.double(), attn_mask=visible,
                                         enable_gqa=True)
    return out.float().transpose(1, 2).reshape(b, n, h * d)


def inputs(batch: int, heads: int, kv: int, n: int, past: int, d: int, seed: int = 0):
    """Queries, and keys and values as views of a larger cache (rows past the prompt never read)."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, heads, n, d, generator=g)
    cache_keys = torch.randn(batch, kv, past + n + 9, d, generator=g) * 2
    cache_values = torch.randn(batch, kv, past + n + 9, d, generator=g)
    return q, cache_keys[:, :, : past + n], cache_values[:, :, : past + n]


@pytest.mark.parametrize("n", [1, 2, 31, 32, 33, 64, 65, 200, 517])
@pytest.mark.parametrize("heads, kv", [(9, 3), (4, 4), (4, 1)], ids=["gqa", "mha", "mqa"])
def test_it_gives_sdpas_causal_attention(kernel, n, heads, kv):
    q, keys, values = inputs(1, heads, kv, n, 0, 64)
    torch.testing.assert_close(kernel.causal(q, keys, values, 0, 64 ** -0.5), reference(q, keys, values, 0),
                               rtol=0, atol=2e-5)


@pytest.mark.parametrize("past", [1, 40, 300])
def test_a_cached_prefix_is_seen_by_every_row_and_batches_and_wide_heads_work(kernel, past):
    q, keys, values = inputs(2, 6, 2, 45, past, 128, seed=past)
    torch.testing.assert_close(kernel.causal(q, keys, values, past, 128 ** -0.5), reference(q, keys, values, past),
                               rtol=0, atol=2e-5)


def test_large_scores_keep_the_running_softmax_finite_and_as_close_as_sdpas_fp32(kernel):
    """Scores in the hundreds: each block's exps are taken from the running maximum, never overflowing; the error
    left is the fp32 rounding of the scores themselves, which SDPA in fp32 has as well."""
    q, keys, values = inputs(1, 4, 2, 150, 0, 64, seed=3)
    exact = reference(q * 40, keys, values, 0)
    out = kernel.causal(q * 40, keys, values, 0, 64 ** -0.5)
    sdpa = F.scaled_dot_product_attention(q * 40, keys, values, is_causal=True, enable_gqa=True)
    assert torch.isfinite(out).all()
    assert (out - exact).abs().max() <= 2 * (sdpa.transpose(1, 2).reshape(out.shape) - exact).abs().max()


def test_the_thread_count_never_changes_a_number(kernel):
    q, keys, values = inputs(1, 9, 3, 300, 0, 64, seed=5)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        alone = kernel.causal(q, keys, values, 0, 0.125)
        torch.set_num_threads(max(2, threads))
        assert torch.equal(kernel.causal(q, keys, values, 0, 0.125), alone)
    finally:
        torch.set_num_threads(threads)


def test_bad_shapes_are_refused_with_a_message(kernel):
    q, keys, values = inputs(1, 9, 3, 10, 0, 64)
    with pytest.raises(RuntimeError, match="inconsistent shapes"):
        kernel.causal(q, keys[:, :2], values[:, :2], 0, 0.125)  # 9 query heads over 2 KV heads
    with pytest.raises(RuntimeError, match="fp32"):
        kernel.causal(q.half(), keys, values, 0, 0.125)


@pytest.mark.skipif(not kernels.wide_vnni(),
                    reason="the 512-bit build needs AVX-512 with VNNI")
def test_the_256_bit_build_gives_the_same_attention(kernel, monkeypatch):
    """Where AVX-512 builds the wide code (4 rows a load, blocks of 64 keys), the 256-bit one (2 rows, 32 keys) is
    what an AVX2-only processor runs: the same attention, summed in other blocks."""
    monkeypatch.setattr(kernels, "WIDE", tuple(name for name in kernels.WIDE if name != "prompt_attention"))
    narrow = kernels._build("prompt_attention")
    assert narrow is not None and narrow.__name__ != kernel.__name__ and narrow.available()
    for n, past in [(1, 0), (33, 0), (250, 0), (70, 19)]:
        q, keys, values = inputs(1, 9, 3, n, past, 64, seed=n)
        torch.testing.assert_close(narrow.causal(q, keys, values, past, 0.125),
                                   kernel.causal(q, keys, values, past, 0.125), rtol=0, atol=2e-5)


@pytest.fixture(scope="module")
def bf16_kernel(kernel):
    if not kernel.bf16_available():
        pytest.skip("the bf16 products need AVX512-BF16")
    return kernel


def rounded(x: torch.Tensor) -> torch.Tensor:
    return x.bfloat16().double()


@pytest.fixture(scope="module")
def amx_kernel(bf16_kernel):
    if not bf16_kernel.amx_available():
        pytest.skip("the tiles need AMX-BF16 (and an OS that grants them)")
    return bf16_kernel


@pytest.mark.parametrize("amx", [False, True], ids=["avx512-bf16", "amx-tiles"])
@pytest.mark.parametrize("n, past", [(1, 0), (2, 0), (15, 0), (16, 0), (17, 0), (31, 0), (33, 0), (64, 0), (65, 0),
                                     (200, 0), (517, 0), (45, 1), (45, 40), (70, 301)])
def test_its_bf16_products_give_the_attention_of_the_rounded_inputs(bf16_kernel, n, past, amx):
    """With bf16 products (AVX512-BF16's, or AMX tiles'), the attention is that of the queries (scaled), keys and
    values rounded to bf16, to the rounding of the softmax's weights (relative 2^-9 each), and at most SDPA's own bf16
    error from the exact one, for any length across the blocks' edges (odd key counts leave a half-filled last pair;
    the tiles take 16 tokens and 32 keys at a time) and a cached prefix."""
    if amx and not bf16_kernel.amx_available():
        pytest.skip("the tiles need AMX-BF16 (and an OS that grants them)")
    q, keys, values = inputs(1, 9, 3, n, past, 64, seed=n + past)
    scale = 64 ** -0.5
    out = bf16_kernel.causal(q, keys, values, past, scale, True, amx)
    visible = torch.ones(n, past + n, dtype=torch.bool).tril(past)
    of_rounded = F.scaled_dot_product_attention(rounded(q * scale), rounded(keys), rounded(values), attn_mask=visible,
                                                enable_gqa=True, scale=1.0).float().transpose(1, 2).reshape(out.shape)
    torch.testing.assert_close(out, of_rounded, rtol=0, atol=4e-3)
    exact = reference(q, keys, values, past)
    sdpa = F.scaled_dot_product_attention(q.bfloat16(), keys.bfloat16(), values.bfloat16(), attn_mask=visible,
                                          enable_gqa=True).float().transpose(1, 2).reshape(out.shape)
    assert (out - exact).abs().max() <= 1.5 * (sdpa - exact).abs().max()
    assert not torch.equal(out, bf16_kernel.causal(q, keys, values, past, scale))  # not the fp32 products


def test_the_bf16_products_never_change_with_the_thread_count_and_wide_heads_work(bf16_kernel):
    q, keys, values = inputs(2, 6, 2, 130, 7, 128, seed=9)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        alone = bf16_kernel.causal(q, keys, values, 7, 128 ** -0.5, True)
        torch.set_num_threads(max(2, threads))
        assert torch.equal(bf16_kernel.causal(q, keys, values, 7, 128 ** -0.5, True), alone)
    finally:
        torch.set_num_threads(threads)
    torch.testing.assert_close(alone, reference(q, keys, values, 7), rtol=0, atol=2e-2)


def test_the_tiles_give_the_avx512_products_numbers_to_their_rounding_for_batches_and_any_thread_count(amx_kernel):
    """The tiles and the AVX512-BF16 products round the same inputs: they differ only where a weight's rounding or a
    sum's order does. Batch rows and heads of several groups land where the kernel's layout puts them, and the thread
    count changes no number."""
    q, keys, values = inputs(2, 8, 2, 150, 20, 64, seed=3)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        alone = amx_kernel.causal(q, keys, values, 20, 0.125, True, True)
        torch.set_num_threads(max(2, threads))
        assert torch.equal(amx_kernel.causal(q, keys, values, 20, 0.125, True, True), alone)
    finally:
        torch.set_num_threads(threads)
    torch.testing.assert_close(alone, amx_kernel.causal(q, keys, values, 20, 0.125, True), rtol=0, atol=4e-3)
    torch.testing.assert_close(alone, reference(q, keys, values, 20), rtol=0, atol=2e-2)


@pytest.mark.parametrize("amx", [False, True], ids=["avx512-bf16", "amx-tiles"])
@pytest.mark.parametrize("kv_dtype", [torch.float16, torch.bfloat16])
def test_bf16_products_read_bf16_queries_and_half_precision_caches_as_their_fp32_copies(bf16_kernel, amx, kv_dtype):
    """A bf16 prefill's queries and an fp16 (or bf16) cache's keys and values go in as they lie, views of the cache
    included: every number is what their fp32 copies give, since widening them is exact. The fp32 products take fp32
    only, and say so."""
    if amx and not bf16_kernel.amx_available():
        pytest.skip("the tiles need AMX-BF16 (and an OS that grants them)")
    g = torch.Generator().manual_seed(11)
    q = torch.randn(1, 9, 70, 64, generator=g).bfloat16()
    cache = (torch.randn(2, 1, 3, 110, 64, generator=g) * 2).to(kv_dtype)
    keys, values = cache[0, :, :, :100], cache[1, :, :, :100]
    out = bf16_kernel.causal(q, keys, values, 30, 0.125, True, amx)
    assert torch.equal(out, bf16_kernel.causal(q.float(), keys.float(), values.float(), 30, 0.125, True, amx))
    with pytest.raises(RuntimeError, match="fp32 queries"):
        bf16_kernel.causal(q, keys, values, 30, 0.125, False)
    with pytest.raises(RuntimeError, match="fp32 queries"):
        bf16_kernel.causal(q.float(), keys, values.float(), 30, 0.125, True, amx)  # keys and values differ


@pytest.mark.parametrize("amx", [False, True], ids=["avx512-bf16", "amx-tiles"])
def test_a_bf16_output_is_the_fp32_one_rounded_as_torch_rounds(bf16_kernel, amx):
    """For a bf16 prefill's output projection the kernel rounds its rows itself: bit for bit what `.to(bfloat16)` of
    its fp32 output gives. Only with bf16 products."""
    if amx and not bf16_kernel.amx_available():
        pytest.skip("the tiles need AMX-BF16 (and an OS that grants them)")
    q, keys, values = inputs(2, 9, 3, 77, 5, 64, seed=13)
    out = bf16_kernel.causal(q, keys, values, 5, 0.125, True, amx, True)
    assert out.dtype == torch.bfloat16
    assert torch.equal(out, bf16_kernel.causal(q, keys, values, 5, 0.125, True, amx).to(torch.bfloat16))
    with pytest.raises(RuntimeError, match="bf16 output"):
        bf16_kernel.causal(q, keys, values, 5, 0.125, False, False, True)


def test_the_tiles_refuse_what_they_do_not_compute(bf16_kernel):
    """Heads of other than 64 dimensions, or fp32 products, on the tiles: a message, not another attention."""
    q, keys, values = inputs(1, 4, 2, 20, 0, 128)
    with pytest.raises(RuntimeError, match="64-dimension"):
        bf16_kernel.causal(q, keys, values, 0, 0.125, True, True)
    q, keys, values = inputs(1, 4, 2, 20, 0, 64)
    with pytest.raises(RuntimeError, match="bf16 products"):
        bf16_kernel.causal(q, keys, values, 0, 0.125, False, True)


def test_bf16_products_are_refused_where_the_build_has_none(kernel, monkeypatch):
    """Asked of a build without them (here, or the 256-bit build an AVX2-only processor runs): a message, not fp32."""
    if kernel.bf16_available():
        if not kernels.wide_vnni():
            pytest.skip("no build without bf16 products to make here")
        monkeypatch.setattr(kernels, "WIDE", tuple(name for name in kernels.WIDE if name != "prompt_attention"))
        kernel = kernels._build("prompt_attention")
    assert not kernel.bf16_available()
    q, keys, values = inputs(1, 9, 3, 10, 0, 64)
    with pytest.raises(RuntimeError, match="AVX512-BF16"):
        kernel.causal(q, keys, values, 0, 0.125, True)
