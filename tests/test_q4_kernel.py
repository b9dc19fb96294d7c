"""The 4-bit products with 8-bit activations (gumiho/kernels/q4_matmul.cpp, int4.Int4Matrix): the kernel's records
hold the Q4_1 weights exactly, products equal their definition (activations rounded per block of 32, exact integer
dots, fp32 scales), every row is computed alike whatever the number of rows, and torch's kernel takes over where
ours cannot build."""

from __future__ import annotations

import shutil

import pytest
import torch

from gumiho import int4, kernels
from gumiho.int4 import AHEAD, GROUP, KEEP, Int4Matrix, Int4Stack, q4_records, unpack_records

pytestmark = pytest.mark.skipif(shutil.which("c++") is None, reason="no C++ compiler to build the kernel")


@pytest.fixture(scope="module")
def kernel():
    module = kernels.q4_matmul()
    assert module is not None, "the kernel did not build (see the warning above)"
    return module


def q4_1(rows: int, columns: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random Q4_1 weights whose d and m are exact in fp16."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 16, (rows, columns), generator=g, dtype=torch.uint8)
    d = (torch.rand(rows, columns // GROUP, generator=g) / 8).half().float()
    m = (-torch.rand(rows, columns // GROUP, generator=g)).half().float()
    return q, d, m


def defined_product(x: torch.Tensor, q: torch.Tensor, d: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """What the kernel computes, in float64: x rounded per block to int8 (dx = max |x| / 127), then
    sum over blocks of d * dx * (q . xq) + m * dx * sum(xq)."""
    blocks = x.reshape(x.shape[0], -1, GROUP)
    amax = blocks.abs().amax(-1, keepdim=True)
    dx = amax / 127
    xq = torch.round(blocks * torch.where(amax > 0, 127 / amax, torch.zeros_like(amax))).clamp(-127, 127)
    dots = torch.einsum("mbi,nbi->mnb", xq.double(), q.double().reshape(q.shape[0], -1, GROUP))
    scaled = dots * (d.double()[None] * dx.double().squeeze(-1)[:, None])
    shifted = m.double()[None] * (dx.squeeze(-1) * xq.sum(-1)).double()[:, None]
    return (scaled + shifted).sum(-1)


def test_records_hold_the_q4_1_weights_exactly():
    q, d, m = q4_1(21, 3 * GROUP, seed=0)  # 21 rows: the last record is padded with zero rows
    records = q4_records(q, d, m)
    assert records.shape == (3, 3 * 160) and records.dtype == torch.uint8
    back_q, back_d, back_m = unpack_records(records, 3 * GROUP)
    assert torch.equal(back_q[:21], q) and torch.equal(back_d[:21], d) and torch.equal(back_m[:21], m)
    assert not back_q[21:].any() and not back_d[21:].any() and not back_m[21:].any()


def test_products_follow_their_definition_and_rows_do_not_depend_on_their_number(kernel):
    q, d, m = q4_1(100, 6 * GROUP, seed=1)
    records = q4_records(q, d, m)
    x = torch.randn(19, 6 * GROUP, generator=torch.Generator().manual_seed(2))
    x[3, :GROUP] = 0  # a block of zeros: dx = 0, no division by zero
    y = kernel.q4_matmul(x, records, AHEAD, KEEP)[:, :100]
    expected = defined_product(x, q, d, m)
    assert torch.allclose(y.double(), expected, rtol=1e-5, atol=1e-5 * expected.abs().max().item())
    for rows in range(1, 20):  # 1 to 19 rows: every tile of up to eight rows, and remainders
        assert torch.equal(kernel.q4_matmul(x[:rows], records, AHEAD, KEEP)[:, :100], y[:rows])
    for i in range(19):
        assert torch.equal(kernel.q4_matmul(x[i : i + 1], records, AHEAD, KEEP)[0, :100], y[i])
    for ahead, keep in int4.FETCHES:  # how the weights are asked for changes no number
        assert torch.equal(kernel.q4_matmul(x, records, ahead, keep)[:, :100], y)


def test_the_activations_are_rounded_as_defined_to_the_bit(kernel):
    """The vector rounding (simd.h's quantize_row) is the scalar definition element by element: in fp32, inverse =
    127 / max |x|, xq = x * inverse rounded half to even and clamped, dx = max |x| / 127, sx = dx * sum(xq). Blocks
    of zeros, exact halves (max |x| = 127: x itself is rounded), huge and tiny values; a NaN counts for nothing in
    the maximum and rounds to -127, as the scalar cast does."""
    g = torch.Generator().manual_seed(11)
    x = torch.randn(7, 8 * GROUP, generator=g) * torch.rand(7, 8 * GROUP, generator=g).pow(6) * 100
    x[0, :GROUP] = 0
    x[1, GROUP : 2 * GROUP] = torch.arange(-15.5, 16.5, 1.0)  # halves: ties to even
    x[1, GROUP] = 127.0
    x[2, 2 * GROUP : 3 * GROUP] *= 1e30
    x[3, 3 * GROUP : 4 * GROUP] *= 1e-30
    x[4, 4 * GROUP + 5] = float("nan")
    xq, dx, sx = kernel.quantize(x)
    blocks = x.reshape(7, -1, GROUP)
    amax = blocks.nan_to_num(0.0).abs().amax(-1, keepdim=True)
    inverse = torch.where(amax > 0, torch.tensor(127.0) / amax, torch.zeros_like(amax))
    expected = torch.round(blocks * inverse).nan_to_num(-127.0).clamp(-127, 127).to(torch.int8)
    assert torch.equal(xq, expected.reshape(7, -1))
    assert torch.equal(dx, amax.squeeze(-1) / 127)
    assert torch.equal(sx, dx * expected.sum(-1, dtype=torch.int32).float())
    assert xq[1, GROUP : 2 * GROUP].tolist()[:4] == [127, -14, -14, -12]  # 127 itself, then -14.5, -13.5, -12.5


def test_the_8bit_activations_cost_little_against_fp32_products(kernel):
    torch.manual_seed(3)
    weight = torch.randn(64, 8 * GROUP)
    matrix = Int4Matrix.quantize(weight, bias=torch.randn(64))
    assert matrix.kernel is kernel
    x = torch.randn(5, 8 * GROUP)
    exact = x @ matrix.dequantized().t() + matrix.bias
    assert (matrix(x) - exact).abs().max() <= 0.01 * exact.abs().max()  # int8 rounding of x, about 0.4% a block
    assert matrix(x[None, None]).shape == (1, 1, 5, 64)


def test_without_our_kernel_torchs_takes_over(monkeypatch):
    if not int4.torch_int4_available():
        pytest.skip("this torch has no CPU int4 kernel")
    monkeypatch.setattr(int4, "q4_matmul", lambda: None)
    q, d, m = q4_1(40, 4 * GROUP, seed=4)
    matrix = Int4Matrix(q, d, m)
    assert matrix.kernel is None and int4.activations() == "bf16" and int4.int4_available()
    x = torch.randn(3, 4 * GROUP)
    exact = x @ (q.float().view(40, -1, GROUP) * d[..., None] + m[..., None]).view(40, -1).t()
    assert (matrix(x) - exact).abs().max() <= 0.01 * exact.abs().max()  # bf16 activations
    assert torch.equal(matrix(x[1:2])[0], matrix(x)[1])


def test_a_stack_of_matrices_in_one_call_equals_each_product_alone(kernel):
    g = torch.Generator().manual_seed(5)
    weight, bias = torch.randn(3, 2 * GROUP, 20, generator=g), torch.randn(3, 20, generator=g)  # (in, out), as heads
    stack = Int4Stack(weight, bias)
    x = torch.randn(2, 4, 2 * GROUP, generator=g)
    together = stack(x, slice(1, 3))
    assert together.shape == (2, 4, 20)
    for i in range(2):
        assert torch.equal(together[i], stack.matrices[1 + i](x[i]))


def _dequantize_into(stack: Int4Stack, weight: torch.Tensor) -> None:
    """Overwrite (in, out) float weights [n, in, out] with what `stack` multiplies by."""
    for i, matrix in enumerate(stack.matrices):
        weight[i] = matrix.dequantized().t()


@pytest.mark.parametrize("kind", ["gumiho", "medusa"])
def test_mlp_heads_in_4_bits_compute_what_their_dequantized_weights_do(kind):
    """The int4 path's inference copies run the heads' stacked weights as 4-bit stacks (`to_int4`): the float
    forward with the 4-bit weights put back gives the same features, to the 8-bit rounding of the activations."""
    from gumiho.drafters.heads import MedusaHeads
    from gumiho.drafters.layers import ParallelHeads

    from .conftest import random_drafter, tiny_target

    heads = random_drafter(kind, tiny_target(seed=6, vocab=16), 6, scale=0.05).heads
    assert isinstance(heads, ParallelHeads if kind == "gumiho" else MedusaHeads)
    width = heads.in_weight.shape[1] if kind == "gumiho" else heads.block_weight.shape[-1]
    u = torch.randn(3, width, generator=torch.Generator().manual_seed(8))
    call = (lambda: heads(u, 2)) if kind == "gumiho" else (lambda: heads(u, slice(0, 2)))
    with torch.no_grad():
        heads.to_int4()
        four_bit = call()
        blocks = heads.int4[1] if kind == "gumiho" else heads.int4
        if kind == "gumiho":
            _dequantize_into(heads.int4[0], heads.in_weight)
        for k, stack in enumerate(blocks):
            _dequantize_into(stack, heads.block_weight[:, k])
        heads.int4 = None
        dequantized = call()
    assert four_bit.shape == dequantized.shape
    assert (four_bit - dequantized).abs().max() <= 0.01 * dequantized.abs().max()


def test_the_512_bit_build_equals_the_256_bit_one_bit_for_bit(kernel, monkeypatch):
    """Where AVX-512 runs VNNI, q4_matmul.cpp multiplies two records (16 output rows) per instruction: the same exact
    integer sums and the same float operations per output as the 256-bit build, so the same numbers on every
    machine (13 records: pairs and one alone)."""
    if not kernels.wide_vnni():
        pytest.skip("no AVX-512 with VNNI here: only the 256-bit build runs")
    assert "-mavx512f" in kernels._flags("q4_matmul", torch.backends.cpu.get_cpu_capability())
    monkeypatch.setattr(kernels, "WIDE", ())
    narrow = kernels._build("q4_matmul")
    assert narrow is not None and narrow is not kernel
    q, d, m = q4_1(100, 6 * GROUP, seed=6)
    records = q4_records(q, d, m)
    x = torch.randn(19, 6 * GROUP, generator=torch.Generator().manual_seed(7))
    for rows in (1, 2, 5, 8, 19):
        assert torch.equal(kernel.q4_matmul(x[:rows], records, AHEAD, KEEP),
                           narrow.q4_matmul(x[:rows], records, AHEAD, KEEP))
