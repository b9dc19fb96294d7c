"""The row-consistent attention (gumiho/kernels/attention.cpp): torch's SDPA numbers, and a tree node's output equal,
bit for bit, to a one-token step's on that node's path whatever else the tree holds."""

import os
import shutil
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from gumiho import kernels

pytestmark = pytest.mark.skipif(shutil.which("c++") is None, reason="no C++ compiler to build the kernel")
KV_HEADS, GROUP, D = 3, 3, 64


@pytest.fixture(scope="module")
def kernel():
    module = kernels.row_attention()
    assert module is not None, "the kernel did not build (see the warning above)"
    return module


def tree_visibility(parents: list[int], past: int, batch: int = 1) -> torch.Tensor:
    """[batch, n, past + n]: the prefix, and each node's ancestors and itself."""
    n = len(parents)
    visible = torch.zeros(batch, n, past + n, dtype=torch.bool)
    visible[..., :past] = True
    for i in range(n):
        j = i
        while j >= 0:
            visible[:, i, past + j] = True
            j = parents[j]
    return visible


def sdpa(q, keys, values, visible):
    mask = torch.zeros(*visible.shape[:1], 1, q.shape[2], visible.shape[-1])
    mask.masked_fill_(~visible.repeat(1, GROUP, 1)[:, None], float("-inf"))
    total = visible.shape[-1]
    return F.scaled_dot_product_attention(q, keys[:, :, :total], values[:, :, :total], attn_mask=mask)


def cache(batch: int = 1, capacity: int = 512, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(batch, KV_HEADS, capacity, D, generator=g),
            torch.randn(batch, KV_HEADS, capacity, D, generator=g))


@pytest.mark.parametrize("past", [0, 1, 37, 300])
@pytest.mark.parametrize("parents", [[-1], [-1, 0], [-1, 0, 0, 1], [-1, 0, 1, 2, 0, 4, 1]])
def test_it_gives_sdpas_numbers_for_any_tree(kernel, past, parents):
    keys, values = cache()
    n = len(parents)
    q = torch.randn(1, KV_HEADS, GROUP * n, D, generator=torch.Generator().manual_seed(past + n))
    visible = tree_visibility(parents, past)
    out = kernel.attention(q, keys, values, visible, n, past, D ** -0.5)
    torch.testing.assert_close(out, sdpa(q, keys, values, visible), rtol=1e-5, atol=1e-5)


def test_causal_steps_and_batches_with_masked_pads(kernel):
    keys, values = cache(batch=2)
    past, n = 20, 3
    q = torch.randn(2, KV_HEADS, GROUP * n, D)
    causal = torch.ones(2, n, past + n, dtype=torch.bool).tril(past)
    out = kernel.attention(q, keys, values, torch.empty(0, dtype=torch.bool), n, past, D ** -0.5)
    torch.testing.assert_close(out, sdpa(q, keys, values, causal), rtol=1e-5, atol=1e-5)
    padded = causal.clone()
    padded[1, :, :5] = False  # the second prompt was left-padded by five
    out = kernel.attention(q, keys, values, padded, n, past, D ** -0.5)
    torch.testing.assert_close(out, sdpa(q, keys, values, padded), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("past", [3, 129, 400])
def test_a_tree_node_equals_the_one_token_step_on_its_path_bit_for_bit(kernel, past):
    """Node 5's path is 0 -> 4 -> 5: a one-token step after accepting nodes 0 and 4 sees the prefix, then those two
    at the next slots, then itself; the tree holds four other nodes between them."""
    parents = [-1, 0, 1, 2, 0, 4, 1]
    n = len(parents)
    keys, values = cache(seed=past)
    q = torch.randn(1, KV_HEADS, GROUP * n, D, generator=torch.Generator().manual_seed(past))
    tree = kernel.attention(q, keys, values, tree_visibility(parents, past), n, past, D ** -0.5)
    per_node = tree.view(1, KV_HEADS, GROUP, n, D)
    for node in range(n):
        path = [node]
        while parents[path[-1]] >= 0:
            path.append(parents[path[-1]])
        path.reverse()
        step_keys, step_values = keys.clone(), values.clone()
        for depth, on_path in enumerate(path):
            step_keys[:, :, past + depth] = keys[:, :, past + on_path]
            step_values[:, :, past + depth] = values[:, :, past + on_path]
        step_q = q.view(1, KV_HEADS, GROUP, n, D)[:, :, :, node].contiguous()
        step = kernel.attention(step_q, step_keys, step_values, torch.empty(0, dtype=torch.bool), 1,
                                past + len(path) - 1, D ** -0.5)
        assert torch.equal(step, per_node[:, :, :, node]), node


@pytest.mark.parametrize("parents", [[-1], [-1, 0, 0, 1]])
def test_a_long_cache_splits_across_threads_with_the_same_numbers(kernel, parents):
    """From attention.cpp's SPLIT_WORK on, a call runs on torch's threads: bit for bit what one thread gives, and
    SDPA's numbers."""
    past, n = 1000, len(parents)
    keys, values = cache(capacity=1024, seed=n)
    q = torch.randn(1, KV_HEADS, GROUP * n, D, generator=torch.Generator().manual_seed(n))
    visible = tree_visibility(parents, past)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        split = kernel.attention(q, keys, values, visible, n, past, D ** -0.5)
        torch.set_num_threads(1)
        alone = kernel.attention(q, keys, values, visible, n, past, D ** -0.5)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(split, alone)
    torch.testing.assert_close(split, sdpa(q, keys, values, visible), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("past", [0, 5, 300])
@pytest.mark.parametrize("parents", [[-1], [-1, 0, 0, 1]])
def test_attend_rotates_writes_the_cache_and_attends_as_the_torch_path_does(kernel, past, parents):
    """`attend` takes a layer's fused projection: its output, and the keys and values it writes, are the lean
    forward's torch path (llama.DecoderStack._attention) up to rounding, the query heads grouped by KV head."""
    from gumiho.llama import DecoderStack, StaticCache

    n, heads = len(parents), KV_HEADS * GROUP
    g = torch.Generator().manual_seed(past + n)
    qkv = torch.randn(2, n, (heads + 2 * KV_HEADS) * D, generator=g)
    angles = torch.rand(2, n, D // 2, generator=g) * 6.0
    cos, sin = torch.cat([angles, angles], -1).cos(), torch.cat([angles, angles], -1).sin()
    visible = tree_visibility(parents, past, batch=2)
    stack = DecoderStack([], heads, KV_HEADS, D, 1e-5, torch.ones(D // 2), 1.0, torch.float32, torch.device("cpu"))
    ours, theirs = (StaticCache(1, KV_HEADS, D, torch.float32, torch.device("cpu"), batch=2) for _ in range(2))
    keys, values = cache(batch=2, seed=past)
    for c in (ours, theirs):
        c.keys[0], c.values[0], c.length = keys, values, past
    out = kernel.attend(qkv, cos, sin, ours.keys[0], ours.values[0], visible, heads, past, D ** -0.5)
    mask = torch.zeros(2, 1, GROUP * n, past + n)
    mask.masked_fill_(~visible.repeat(1, GROUP, 1)[:, None], float("-inf"))
    expected = stack._attention(qkv, cos, sin, theirs, 0, False, mask)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ours.keys, theirs.keys, rtol=1e-5, atol=1e-5)
    assert torch.equal(ours.values, theirs.values)


@pytest.mark.parametrize("past", [3, 129, 400])
def test_an_fp16_cache_is_read_as_its_values_widened_to_fp32(kernel, past):
    """The int4 path's cache holds fp16 keys and values: the kernel widens them as it loads them, so its output is,
    bit for bit, what the fp32 cache of the same (rounded) numbers gives, and every row-consistency property holds."""
    parents = [-1, 0, 1, 2, 0, 4, 1]
    n = len(parents)
    keys, values = (t.half() for t in cache(seed=past))
    q = torch.randn(1, KV_HEADS, GROUP * n, D, generator=torch.Generator().manual_seed(past))
    visible = tree_visibility(parents, past)
    out = kernel.attention(q, keys, values, visible, n, past, D ** -0.5)
    assert torch.equal(out, kernel.attention(q, keys.float(), values.float(), visible, n, past, D ** -0.5))
    causal = kernel.attention(q, keys, values, torch.empty(0, dtype=torch.bool), n, past, D ** -0.5)
    assert torch.equal(causal, kernel.attention(q, keys.float(), values.float(), torch.empty(0, dtype=torch.bool), n,
                                                past, D ** -0.5))


def test_attend_rounds_what_it_writes_to_an_fp16_cache(kernel):
    """`attend` on an fp16 cache writes the rotated keys and the values rounded to fp16 (to nearest, as torch
    rounds them) and attends over the cache as it then is."""
    past, n, heads = 37, 3, KV_HEADS * GROUP
    g = torch.Generator().manual_seed(11)
    qkv = torch.randn(1, n, (heads + 2 * KV_HEADS) * D, generator=g)
    angles = torch.rand(1, n, D // 2, generator=g) * 6.0
    cos, sin = torch.cat([angles, angles], -1).cos(), torch.cat([angles, angles], -1).sin()
    keys, values = cache(seed=5)
    half_keys, half_values = keys.half(), values.half()
    wide_keys, wide_values = half_keys.float(), half_values.float()
    visible = tree_visibility([-1, 0, 1], past)
    out = kernel.attend(qkv, cos, sin, half_keys, half_values, visible, heads, past, D ** -0.5)
    wide = kernel.attend(qkv, cos, sin, wide_keys, wide_values, visible, heads, past, D ** -0.5)
    assert torch.equal(half_keys, wide_keys.half()) and torch.equal(half_values, wide_values.half())
    assert not torch.equal(half_keys.float(), wide_keys)  # the new keys were rounded in the fp16 cache only
    torch.testing.assert_close(out, wide, rtol=0, atol=5e-3)


@pytest.mark.parametrize("width", [1, 2], ids=["transposed keys", "amx tiles"])
def test_kept_key_tiles_give_the_keys_own_numbers_through_growth_compaction_and_truncation(kernel, width):
    """An fp16 cache that keeps its keys transposed (StaticCache(tiles=1), the 512-bit build), or the AMX path's key
    and value tiles (tiles=2): every call's output and the keys it writes equal, bit for bit, those of the same cache
    without tiles, over trees of 1 to 12 tokens, the accepted paths compacted (`keep`), the cache grown (`reserve`)
    and cut back (`truncate`, `crop`) below what the tiles held, and batch rows dropped (`keep_rows`)."""
    from gumiho.llama import TILE, StaticCache

    amx = width == 2
    if amx:
        amx_or_skip(kernel)
    elif not kernel.keeps_tiles():
        pytest.skip("this build keeps no tiles (no 512-bit vectors)")
    heads, layers = KV_HEADS * GROUP, 2
    g = torch.Generator().manual_seed(7)
    tiled, plain = (StaticCache(layers, KV_HEADS, D, torch.float16, torch.device("cpu"), capacity=40, batch=2,
                                tiles=tiles) for tiles in (width, 0))
    start = torch.randn(layers, 2, KV_HEADS, 37, D, generator=g).half()
    for c in (tiled, plain):
        c.keys[:, :, :, :37], c.values[:, :, :, :37], c.length = start, start.flip(-1), 37
    sizes = [1, 4, 2, 12, 3, 1, 7, 5, 9, 3, 6, 4]
    for step, n in enumerate(sizes * 2):
        if step == len(sizes):
            for c in (tiled, plain):
                c.keep_rows(torch.tensor([1]))
        batch, past = tiled.keys.shape[1], tiled.length
        parents = [-1] + [int(torch.randint(i, (1,), generator=g)) for i in range(1, n)]
        visible = tree_visibility(parents, past, batch=batch)
        qkv = torch.randn(batch, n, (heads + 2 * KV_HEADS) * D, generator=g)
        angles = torch.rand(batch, n, D // 2, generator=g) * 6.0
        cos, sin = torch.cat([angles, angles], -1).cos(), torch.cat([angles, angles], -1).sin()
        for c in (tiled, plain):
            c.reserve(past + n)
        outs = [[kernel.attend(qkv, cos, sin, c.keys[i], c.values[i], visible, heads, past, D ** -0.5, c.tiles,
                               c.tiled, i, amx=amx) for i in range(layers)] for c in (tiled, plain)]
        assert all(torch.equal(a, b) for a, b in zip(*outs)), (step, n)
        assert torch.equal(tiled.keys[..., : past + n, :], plain.keys[..., : past + n, :])
        # a tree of 3 tokens or more (TREE_ROWS query rows) scored the committed blocks from the tiles; on the AMX
        # tiles every call brings them up
        if n >= 3 or amx:
            assert tiled.tiled.tolist() == [past // TILE * TILE] * layers
        path = torch.tensor([0] + [i for i in range(1, n) if parents[i] == i - 1][:2])
        for c in (tiled, plain):
            c.length = past + n
            c.keep(past, path if step % 3 else torch.arange(len(path)))
            if step % 5 == 4:
                c.truncate(c.length - 20)
            if step % 7 == 6:
                c.crop(3)
        assert int(tiled.tiled.max()) <= tiled.length // TILE * TILE


def amx_or_skip(kernel) -> None:
    if not kernel.amx():
        pytest.skip("no AMX tiles here (the processor, the build or the OS)")


def half_cache(seed: int, capacity: int = 1100) -> tuple[torch.Tensor, torch.Tensor]:
    return tuple(part.half() for part in cache(capacity=capacity, seed=seed))


CHAINS_AND_BRANCHES = [[-1], [-1, 0, 0, 1], [-1, 0, 1, 2, 0, 4, 1], list(range(-1, 9))]


@pytest.mark.parametrize("past", [0, 5, 28, 31, 32, 37, 60, 300, 1000])  # 28, 60: branches across a block of 32
@pytest.mark.parametrize("parents", CHAINS_AND_BRANCHES)
def test_on_amx_tiles_a_tree_node_equals_the_one_token_step_on_its_path_bit_for_bit(kernel, past, parents):
    """In bf16 tile products a sum runs over blocks of 32 keys, so a node whose ancestors sit at other slots than a
    one-token step's could round apart: the kernel gathers each token's keys past the last common block, so every
    node still gets the step's numbers. Both are SDPA's within bf16 rounding."""
    amx_or_skip(kernel)
    n = len(parents)
    keys, values = half_cache(past)
    q = torch.randn(1, KV_HEADS, GROUP * n, D, generator=torch.Generator().manual_seed(past + n))
    visible = tree_visibility(parents, past)
    tree = kernel.attention(q, keys, values, visible, n, past, D ** -0.5, amx=True)
    torch.testing.assert_close(tree, sdpa(q, keys.float(), values.float(), visible), rtol=0, atol=3e-2)
    per_node = tree.view(1, KV_HEADS, GROUP, n, D)
    for node in range(n):
        path = [node]
        while parents[path[-1]] >= 0:
            path.append(parents[path[-1]])
        path.reverse()
        step_keys, step_values = keys.clone(), values.clone()
        for depth, on_path in enumerate(path):
            step_keys[:, :, past + depth] = keys[:, :, past + on_path]
            step_values[:, :, past + depth] = values[:, :, past + on_path]
        step_q = q.view(1, KV_HEADS, GROUP, n, D)[:, :, :, node].contiguous()
        step = kernel.attention(step_q, step_keys, step_values, torch.empty(0, dtype=torch.bool), 1,
                                past + len(path) - 1, D ** -0.5, amx=True)
        assert torch.equal(step, per_node[:, :, :, node]), node


def test_on_amx_tiles_batches_masks_and_threads_change_no_row(kernel):
    """Left-padded batch rows, a causal call and the split across threads: each row's numbers are its own."""
    amx_or_skip(kernel)
    past, n = 700, 3
    keys, values = (torch.cat([part, part.flip(-1)]) for part in half_cache(1))
    q = torch.randn(2, KV_HEADS, GROUP * n, D, generator=torch.Generator().manual_seed(2))
    causal = torch.ones(2, n, past + n, dtype=torch.bool).tril(past)
    padded = causal.clone()
    padded[1, :, :45] = False
    threads = torch.get_num_threads()
    try:
        outs = []
        for count in (1, 2):
            torch.set_num_threads(count)
            outs.append([kernel.attention(q, keys, values, visible, n, past, D ** -0.5, amx=True)
                         for visible in (torch.empty(0, dtype=torch.bool), causal, padded)])
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(a, b) for a, b in zip(*outs))
    alone, causal_out, padded_out = outs[0]
    assert torch.equal(alone, causal_out)
    torch.testing.assert_close(padded_out, sdpa(q, keys.float(), values.float(), padded), rtol=0, atol=3e-2)
    for row in range(2):  # a batch row alone gets what it got beside the other
        single = kernel.attention(q[row : row + 1], keys[row : row + 1], values[row : row + 1], padded[row : row + 1],
                                  n, past, D ** -0.5, amx=True)
        assert torch.equal(single, padded_out[row : row + 1])


def test_without_amx_tiles_the_amx_flag_changes_nothing(kernel):
    """Where the tiles do not apply (an fp32 cache; heads other than 64 dimensions; a processor without AMX), a call
    asking for them gets the fp32 numbers."""
    keys, values = cache(seed=4)
    q = torch.randn(1, KV_HEADS, GROUP * 2, D, generator=torch.Generator().manual_seed(4))
    visible = tree_visibility([-1, 0], 50)
    assert torch.equal(kernel.attention(q, keys, values, visible, 2, 50, D ** -0.5, amx=True),
                       kernel.attention(q, keys, values, visible, 2, 50, D ** -0.5))
    narrow = q[..., :32].contiguous(), keys[..., :32].half(), values[..., :32].half()
    assert torch.equal(kernel.attention(*narrow, visible, 2, 50, 32 ** -0.5, amx=True),
                       kernel.attention(*narrow, visible, 2, 50, 32 ** -0.5))


BUILDS = (kernels.row_attention, kernels.row_ops, kernels.q8_matmul, kernels.q4_matmul, kernels.prompt_attention)


def test_the_row_operations_are_torchs_and_a_row_never_depends_on_the_others():
    ops = kernels.row_ops()
    assert ops is not None, "the kernel did not build (see the warning above)"
    g = torch.Generator().manual_seed(0)
    x, delta = torch.randn(5, 576, generator=g), torch.randn(5, 576, generator=g)
    weight = torch.randn(576, generator=g)
    eps = 1e-5
    torch.testing.assert_close(ops.rms_norm(x, weight, eps),
                               weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)))
    total, normed = ops.add_rms_norm(x, delta, weight, eps)
    assert torch.equal(total, x + delta) and torch.equal(normed, ops.rms_norm(x + delta, weight, eps))
    gate_up = torch.randn(5, 2 * 1536, generator=g)
    gate, up = gate_up.chunk(2, -1)
    torch.testing.assert_close(ops.silu_mul(gate_up), F.silu(gate) * up)
    for row in range(5):
        assert torch.equal(ops.rms_norm(x[row : row + 1], weight, eps)[0], ops.rms_norm(x, weight, eps)[row])
        assert torch.equal(ops.silu_mul(gate_up[row : row + 1])[0], ops.silu_mul(gate_up)[row])


def test_a_prompts_many_rows_shared_out_among_threads_get_each_rows_own_numbers():
    """From 64 rows (a prompt) the row operations split the rows across torch's threads: every row still equals
    that row computed alone, bit for bit."""
    ops = kernels.row_ops()
    g = torch.Generator().manual_seed(1)
    x, delta, weight = torch.randn(301, 576, generator=g), torch.randn(301, 576, generator=g), torch.randn(576)
    gate_up = torch.randn(301, 2 * 1536, generator=g)
    total, normed = ops.add_rms_norm(x, delta, weight, 1e-5)
    many = ops.rms_norm(x, weight, 1e-5), total, normed, ops.silu_mul(gate_up)
    for row in (0, 150, 300):
        one_total, one_normed = ops.add_rms_norm(x[row : row + 1], delta[row : row + 1], weight, 1e-5)
        alone = (ops.rms_norm(x[row : row + 1], weight, 1e-5), one_total, one_normed,
                 ops.silu_mul(gate_up[row : row + 1]))
        for together, single in zip(many, alone):
            assert torch.equal(together[row], single[0])


def bits(x: torch.Tensor) -> torch.Tensor:
    """A bf16 tensor's bit patterns, every NaN as one (torch's own conversions keep a NaN's sign and payload in
    some loops and not in others)."""
    return torch.where(x.isnan(), torch.iinfo(torch.int16).min, x.view(torch.int16))


@pytest.mark.parametrize("rows", [1, 3, 150])
@pytest.mark.parametrize("width", [576, 37])  # 37: the vector loops' tails
def test_rows_handed_over_in_bf16_are_the_fp32_rows_rounded_as_torch_rounds_them(rows, width):
    """A prompt whose products run in bf16 takes its norms in bf16 and hands bf16 products to the norms and the gated
    product: each result is the fp32 call's on the same values, rounded by torch's own conversion, bit for bit (the
    numbers casts around each product gave)."""
    ops = kernels.row_ops()
    g = torch.Generator().manual_seed(rows * width)
    x, weight = torch.randn(rows, width, generator=g), torch.randn(width, generator=g)
    delta = torch.randn(rows, width, generator=g).bfloat16()
    gate_up = (4 * torch.randn(rows, 2 * width, generator=g)).bfloat16()
    gate_up[0, :3] = torch.tensor([float("inf"), float("-inf"), float("nan")])
    assert torch.equal(bits(ops.rms_norm(x, weight, 1e-5, True)), bits(ops.rms_norm(x, weight, 1e-5).bfloat16()))
    total, normed = ops.add_rms_norm(x, delta, weight, 1e-5, True)
    total_fp32, normed_fp32 = ops.add_rms_norm(x, delta.float(), weight, 1e-5)
    assert total.dtype == torch.float32 and torch.equal(total, total_fp32)
    assert torch.equal(bits(normed), bits(normed_fp32.bfloat16()))
    assert torch.equal(bits(ops.silu_mul(gate_up)), bits(ops.silu_mul(gate_up.float()).bfloat16()))


def test_the_bf16_rounding_is_torchs_at_ties_extremes_and_nans():
    """A row of ones normed with eps 0 is its weight exactly, so the weight shows the rounding itself: ties to even,
    the largest values to infinity, subnormals, infinities and NaNs as torch's conversion gives them, in the vector
    loop and its tail alike."""
    ops = kernels.row_ops()
    specials = torch.tensor([1 + 2 ** -8, 1 + 3 * 2 ** -8, -(1 + 2 ** -8), 1 + 2 ** -8 + 2 ** -20, 3.4e38, -3.4e38,
                             2 ** -130, -(2 ** -133) * 3, 0.0, -0.0, float("inf"), float("-inf"), float("nan"),
                             -float("nan"), 65504.0, 1e-45])
    weight = torch.cat([specials, specials, specials[:5]])  # 37: two vectors of 16 and a tail of 5
    normed = ops.rms_norm(torch.ones(2, len(weight)), weight, 0.0, True)
    assert torch.equal(bits(normed), bits(weight.bfloat16()).expand(2, -1))


def test_a_prompts_rotary_reads_bf16_products_as_their_fp32_values(kernel):
    """`rotate` takes a prompt's bf16 qkv product as its fp32 values, tokens shared out among threads included, and
    for a bf16 attention returns its queries in bf16, rounded as torch rounds the fp32 ones."""
    from gumiho.llama import StaticCache

    heads, n = KV_HEADS * GROUP, 130
    g = torch.Generator().manual_seed(7)
    qkv = torch.randn(1, n, (heads + 2 * KV_HEADS) * D, generator=g).bfloat16()
    angles = torch.rand(1, n, D // 2, generator=g) * 6.0
    cos, sin = torch.cat([angles, angles], -1).cos(), torch.cat([angles, angles], -1).sin()
    caches = [StaticCache(1, KV_HEADS, D, torch.float16, torch.device("cpu")) for _ in range(2)]
    for c in caches:
        c.keys.zero_(), c.values.zero_()
    queries = [kernel.rotate(x, cos, sin, c.keys[0], c.values[0], heads, 0) for x, c in zip((qkv, qkv.float()), caches)]
    assert queries[0].dtype == torch.float32 and torch.equal(queries[0], queries[1])
    assert torch.equal(caches[0].keys, caches[1].keys) and torch.equal(caches[0].values, caches[1].values)
    rounded = kernel.rotate(qkv, cos, sin, caches[1].keys[0], caches[1].values[0], heads, 0, True)
    assert rounded.dtype == torch.bfloat16 and torch.equal(bits(rounded), bits(queries[0].bfloat16()))
    assert torch.equal(caches[0].keys, caches[1].keys) and torch.equal(caches[0].values, caches[1].values)


@pytest.mark.parametrize("n, cache_dtype", [(3, torch.float32), (200, torch.float32), (200, torch.float16)])
def test_a_prompts_rotary_through_rotate_is_the_torch_paths(kernel, n, cache_dtype):
    """A prompt's causal attention takes its rotary and cache writes from `rotate` (its tokens shared out among
    threads, the queries grouped by KV head): the layer's output and the cache it writes are the torch path's
    (llama.DecoderStack._attention without the kernel) up to rounding."""
    from gumiho.llama import DecoderStack, StaticCache

    heads = KV_HEADS * GROUP
    g = torch.Generator().manual_seed(n)
    qkv = torch.randn(1, n, (heads + 2 * KV_HEADS) * D, generator=g)
    angles = torch.rand(1, n, D // 2, generator=g) * 6.0
    cos, sin = torch.cat([angles, angles], -1).cos(), torch.cat([angles, angles], -1).sin()
    stacks = [DecoderStack([], heads, KV_HEADS, D, 1e-5, torch.ones(D // 2), 1.0, torch.float32, torch.device("cpu"))
              for _ in range(2)]
    stacks[1].row_attention = None  # torch's rotary and cache writes
    caches = [StaticCache(1, KV_HEADS, D, cache_dtype, torch.device("cpu")) for _ in range(2)]
    for c in caches:
        c.keys.zero_(), c.values.zero_()
    ours, theirs = (stack._attention(qkv, cos, sin, c, 0, True, None) for stack, c in zip(stacks, caches))
    tolerance = 1e-5 if cache_dtype == torch.float32 else 1e-3
    torch.testing.assert_close(ours, theirs, rtol=tolerance, atol=tolerance)
    torch.testing.assert_close(caches[0].keys, caches[1].keys, rtol=tolerance, atol=tolerance)
    assert torch.equal(caches[0].values, caches[1].values)


@pytest.mark.parametrize("rows, vocab, k, temperature", [(1, 16384, 1, 1.0), (3, 16384, 3, 1.0), (15, 8192, 8, 0.7),
                                                         (2, 49152, 32, 1.3), (4, 37, 5, 1.0)])
def test_top_logprobs_are_torchs_log_softmax_and_top_k(rows, vocab, k, temperature):
    ops = kernels.row_ops()
    g = torch.Generator().manual_seed(rows * vocab + k)
    logits = 4 * torch.randn(rows, vocab, generator=g)
    values, indices = ops.top_logprobs(logits, k, temperature)
    expected = torch.topk(torch.log_softmax(logits / temperature, -1), k, -1)
    assert torch.equal(indices, expected.indices)
    torch.testing.assert_close(values, expected.values, rtol=0, atol=1e-5)


def test_top_logprobs_break_ties_by_index_and_score_a_row_with_a_nan_or_an_inf_minus_infinity():
    ops = kernels.row_ops()
    values, indices = ops.top_logprobs(torch.tensor([[1.0, 3.0, 3.0, 2.0, 3.0]]), 4, 1.0)
    assert indices.tolist() == [[1, 2, 4, 3]] and values[0, 0] == values[0, 2] > values[0, 3]
    broken = torch.randn(3, 64)
    broken[1, 10], broken[2, 20] = float("nan"), float("inf")
    values, indices = ops.top_logprobs(broken, 3, 1.0)
    assert torch.isfinite(values[0]).all() and (values[1:] == -torch.inf).all()
    assert indices[1].tolist() == [0, 1, 2]


def test_top_logprobs_ties_and_nans_past_the_first_vector_blocks():
    """The selection skips blocks of eight that hold nothing better than the k-th best so far: ties with it, later
    better entries, a NaN or an infinity deep in the row, and rows whose length is no multiple of eight."""
    ops = kernels.row_ops()
    g = torch.Generator().manual_seed(5)
    for vocab in (9, 23, 64, 4099):
        for k in (1, 3, 8):
            logits = torch.randint(-4, 4, (3, vocab), generator=g).float()  # many ties
            logits[1, vocab - 1] = 10.0  # the best entry last, in the tail after the blocks
            values, indices = ops.top_logprobs(logits, k, 1.0)
            expected = torch.topk(torch.log_softmax(logits, -1), k, -1, sorted=True)
            torch.testing.assert_close(values, expected.values, rtol=0, atol=1e-5)
            for row in range(3):  # equal values: the lower index first
                order = sorted(range(vocab), key=lambda i: (-logits[row, i].item(), i))[:k]
                assert indices[row].tolist() == order
            broken = logits.clone()
            broken[0, vocab - 2], broken[2, vocab // 2] = float("nan"), float("inf")
            values, _ = ops.top_logprobs(broken, k, 1.0)
            assert (values[0] == -torch.inf).all() and (values[2] == -torch.inf).all()
            assert torch.isfinite(values[1]).all()


@pytest.mark.parametrize("vocab", [1, 7, 8, 17, 4096, 49152])
def test_argmax_is_torchs(vocab):
    """The first largest entry, or the first NaN where there is one, as torch.argmax answers (ties, a tail past the
    blocks of eight, infinities)."""
    ops = kernels.row_ops()
    g = torch.Generator().manual_seed(vocab)
    for trial in range(40):
        row = torch.randint(-3, 3, (vocab,), generator=g).float() if trial % 2 else torch.randn(vocab, generator=g)
        if trial % 5 == 1:
            row[int(torch.randint(vocab, (1,), generator=g))] = float("inf")
        if trial % 7 == 2:
            row[int(torch.randint(vocab, (1,), generator=g))] = float("nan")
        assert ops.argmax(row) == int(row.argmax()), row
    with pytest.raises(RuntimeError):
        ops.argmax(torch.zeros(0))


def test_the_kernels_can_be_switched_off(monkeypatch):
    monkeypatch.setenv("GUMIHO_KERNELS", "0")
    for build in BUILDS:
        build.cache_clear()
    try:
        assert all(build() is None for build in BUILDS)
    finally:
        monkeypatch.delenv("GUMIHO_KERNELS")
        for build in BUILDS:
            build.cache_clear()


@pytest.mark.parametrize("built", [True, False], ids=["built", "to-link"])
def test_a_lock_left_by_a_build_that_died_stops_no_later_process(kernel, tmp_path, built):
    """torch's lock file outlives a process killed mid-build; the next process must neither wait on it nor fail."""
    folder, module = kernels.build_folder("attention")
    copy = tmp_path / "kernels" / folder.name
    shutil.copytree(folder, copy, ignore=shutil.ignore_patterns("*lock"))
    (copy / "lock").touch()  # what the dead process left
    if not built:
        (copy / f"{module}.so").unlink()  # its object file is kept: a link, seconds, not a compile
    script = "from gumiho import kernels; assert kernels.row_attention() is not None"
    done = subprocess.run([sys.executable, "-c", script], env={**os.environ, "GUMIHO_CACHE": str(tmp_path)},
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "unavailable" not in done.stderr and (copy / f"{module}.so").is_file()


@pytest.mark.parametrize("shape", [(1, 32), (3, 32), (2, 3, 32)], ids=["one row", "rows", "heads x rows"])
def test_a_drafters_top_tokens_are_the_same_through_the_kernel_and_through_torch(monkeypatch, shape):
    from gumiho.drafters import base, new_drafter

    from .conftest import tiny_target

    target = tiny_target(vocab=64)
    drafter = new_drafter("gumiho", target.model.config, seed=0, draft_vocab_size=40)
    drafter.draft_vocab.copy_(torch.randperm(64, generator=torch.Generator().manual_seed(1))[:40])
    drafter = target.prepare_drafter(drafter)
    hidden = torch.randn(*shape, generator=torch.Generator().manual_seed(2)).to(target.device, target.dtype)
    fused = drafter.top_tokens(hidden, 5, 0.7)
    monkeypatch.setattr(base, "FUSED_TOP_K", 0)
    plain = drafter.top_tokens(hidden, 5, 0.7)
    assert fused[0].shape == plain[0].shape == (*shape[:-1], 5)
    assert torch.equal(fused[1], plain[1]) and set(fused[1].flatten().tolist()) <= set(drafter.draft_vocab.tolist())
    torch.testing.assert_close(fused[0], plain[0], rtol=0, atol=1e-5)


@pytest.mark.skipif(not kernels.wide_vnni(),
                    reason="the 512-bit build needs AVX-512 with VNNI")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32 cache", "fp16 cache"])
def test_the_512_bit_build_gives_the_256_bit_builds_numbers_bit_for_bit(kernel, monkeypatch, dtype):
    """attention.cpp's AVX-512 paths only do more of the 256-bit code's float operations per instruction, in the same
    order: a machine's wider build must not change a single output (a cache tail of any length, masked keys)."""
    monkeypatch.setattr(kernels, "WIDE", tuple(name for name in kernels.WIDE if name != "attention"))
    narrow = kernels._build("attention")
    assert narrow is not None and narrow.__name__ != kernel.__name__
    g = torch.Generator().manual_seed(7)
    for past, parents in [(0, [-1]), (37, [-1, 0, 0, 1]), (300, [-1, 0, 1, 2, 0, 4, 1]), (1000, [-1, 0]),
                          (123, list(range(-1, 16)))]:
        n = len(parents)
        keys, values = (torch.randn(2, KV_HEADS, past + n + 5, D, generator=g).to(dtype) for _ in range(2))
        q = torch.randn(2, KV_HEADS, GROUP * n, D, generator=g) * 3
        for visible in (tree_visibility(parents, past, batch=2), torch.empty(0, dtype=torch.bool)):
            assert torch.equal(kernel.attention(q, keys, values, visible, n, past, D ** -0.5),
                               narrow.attention(q, keys, values, visible, n, past, D ** -0.5)), (past, n)


def test_the_builds_follow_torchs_capability_not_the_processors_flags_alone(monkeypatch):
    """ATEN_CPU_CAPABILITY=avx2 on an AVX-512 machine builds what an AVX2-only processor runs: no AVX-512 or VNNI."""
    monkeypatch.setattr(kernels, "_cpu_flags", lambda: {"avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni"})
    assert {"-mavx512f", "-mavx512vnni"} <= set(kernels._flags("q4_matmul", "AVX512"))
    narrow = kernels._flags("q4_matmul", "AVX2")
    assert "-mavx2" in narrow and not any(flag.startswith("-mavx512") for flag in narrow)
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")
    assert not kernels.wide_vnni()
