"""A long prompt's bf16 products on AMX tiles (gumiho/tiles.py, kernels/tile_matmul.cpp): the products of the
bf16 values summed in fp32 and rounded once to bf16, whatever the row count, the unit a row falls in or the thread
count; the SiLU-gated product from the same sums; clear refusals. Skipped where the machine has no AMX tiles."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from gumiho.kernels import tile_matmul
from gumiho.tiles import TileMatrix, tiles_available, tiles_fit

pytestmark = pytest.mark.skipif(not tiles_available(), reason="no AMX tiles here (the processor, the build or the OS)")


def bf16_pair(rows: int, k: int, n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, k, generator=generator).bfloat16()
    w = (torch.randn(n, k, generator=generator) / k ** 0.5).bfloat16()
    return x, w


def exact(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """The products of the bf16 values, summed in fp64: what the tiles' fp32 sums approximate."""
    y = x.double() @ w.double().T
    return y if bias is None else y + bias.double()


def assert_rounded_from(y: torch.Tensor, reference: torch.Tensor) -> None:
    """y is the bf16 rounding of a value within fp32 summation error of `reference`: at most one bf16 step away,
    and equal to reference's own rounding for nearly every element (a sum lying at a rounding boundary may round
    the other way)."""
    assert y.dtype == torch.bfloat16
    step = reference.abs().clamp_min(1e-30) * 2.0 ** -7  # a bf16 step (8 significant bits)
    assert ((y.double() - reference).abs() <= step + 1e-6).all()
    assert (y == reference.float().bfloat16()).float().mean() > 0.99


@pytest.mark.parametrize("rows", [1, 5, 16, 31, 32, 33, 100, 385, 800])  # tails of a tile, of a block, of a unit
@pytest.mark.parametrize("k, n", [(32, 32), (576, 96), (96, 320)])
def test_the_tiles_give_the_products_rounded_to_bf16(rows, k, n):
    x, w = bf16_pair(rows, k, n, seed=rows + n)
    assert_rounded_from(TileMatrix(w)(x), exact(x, w))


def test_a_bias_is_added_to_the_fp32_sums_and_fp32_rows_come_back_fp32():
    x, w = bf16_pair(40, 64, 96, seed=1)
    bias = torch.randn(96)
    y = TileMatrix(w, bias)(x)
    assert_rounded_from(y, exact(x, w, bias))
    as_float = TileMatrix(w, bias)(x.float())  # cast to bf16 on the way in, the bf16 result widened
    assert as_float.dtype == torch.float32 and torch.equal(as_float, y.float())
    batched = TileMatrix(w, bias)(x.view(2, 20, 64))
    assert batched.shape == (2, 20, 96) and torch.equal(batched.view(40, 96), y)
    assert torch.equal(copy.deepcopy(TileMatrix(w, bias))(x), y)  # a drafter holding one may be copied


@pytest.mark.parametrize("rows", [3, 70, 400])
def test_the_gated_product_is_silu_of_the_gate_times_the_up_projection(rows):
    """A stacked [gate; up] weight gives silu(x G^T + b_g) * (x U^T + b_u) from the fp32 sums, rounded once: within
    bf16 rounding of the exact value, closer than the two products rounded to bf16 first (torch's order: the
    product, then rows.silu_mul)."""
    inner = 96
    x, w = bf16_pair(rows, 64, 2 * inner, seed=rows)
    bias = torch.randn(2 * inner) / 4
    matrix = TileMatrix(w, bias, gated=True)
    y = matrix.gated_product(x)
    sums = exact(x, w, bias)
    reference = F.silu(sums[:, :inner]) * sums[:, inner:]
    assert y.shape == (rows, inner) and y.dtype == torch.bfloat16
    assert_rounded_from(y, reference)
    rounded_first = sums.float().bfloat16().float()
    two_roundings = (F.silu(rounded_first[:, :inner]) * rounded_first[:, inner:]).bfloat16()
    assert (y.double() - reference).abs().sum() < (two_roundings.double() - reference).abs().sum()
    with pytest.raises(TypeError, match="gated product only"):
        matrix(x)


def test_a_row_gets_the_same_numbers_whatever_the_threads_and_the_rows_beside_it():
    """Each output is one block's sums over all of K, in the same order wherever its row falls: the same bits at 1
    and 2 threads, and for a row alone as among 800."""
    x, w = bf16_pair(800, 576, 192, seed=7)
    matrix = TileMatrix(w)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = matrix(x)
        torch.set_num_threads(2)
        two = matrix(x)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one, two)
    for row in (0, 31, 32, 383, 384, 799):
        assert torch.equal(matrix(x[row : row + 1]), one[row : row + 1])


def test_shapes_the_tiles_do_not_take_are_refused_with_a_message():
    assert tiles_fit(torch.empty(64, 32)) and not tiles_fit(torch.empty(64, 40)) and not tiles_fit(torch.empty(48, 32))
    with pytest.raises(ValueError, match="multiples of 32"):
        TileMatrix(torch.randn(64, 40))
    kernel = tile_matmul()
    with pytest.raises(RuntimeError, match="multiples of 32"):
        kernel.pack(torch.randn(48, 64).bfloat16(), True)
    packed = kernel.pack(torch.randn(64, 64).bfloat16(), False)
    with pytest.raises(RuntimeError, match="x has 32 columns, the weight 64"):
        kernel.matmul(torch.randn(3, 32).bfloat16(), packed, torch.empty(0), False)
    with pytest.raises(RuntimeError, match="bf16 x"):
        kernel.matmul(torch.randn(3, 64), packed, torch.empty(0), False)
    with pytest.raises(RuntimeError, match="bias fp32"):
        kernel.matmul(torch.randn(3, 64).bfloat16(), packed, torch.zeros(63), False)
    with pytest.raises(RuntimeError, match="packed by pack"):
        kernel.matmul(torch.randn(3, 64).bfloat16(), torch.zeros(4, 2, 16, 32), torch.empty(0), False)
