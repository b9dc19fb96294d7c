"""The int4 path's lm_head in 8-bit blocks (gumiho/kernels/q8_matmul.cpp, int4.Q8Matrix): products equal to the
dequantized weight times the input rounded to 8 bits per block, rows computed alike whatever their number, Q8_0
blocks recovered exactly; and the greedy walk
that reads the draft's likeliest path in one product, deciding exactly as the one-row walk does."""

from __future__ import annotations

import shutil

import pytest
import torch

from gumiho import int4, kernels
from gumiho.int4 import AHEAD, GROUP, KEEP, Q8Matrix
from gumiho.tree import DraftPool, build_tree
from gumiho.sampling import SamplingConfig
from gumiho.verify import ALL_ROWS, PREFETCH_ROWS, LazyLogits, verify_sampling, walk_greedy

pytestmark = pytest.mark.skipif(shutil.which("c++") is None, reason="no C++ compiler to build the kernel")


@pytest.fixture(scope="module")
def kernel():
    module = kernels.q8_matmul()
    assert module is not None, "the kernel did not build (see the warning above)"
    return module


def test_products_equal_the_dequantized_weight_and_rows_do_not_depend_on_their_number(kernel):
    g = torch.Generator().manual_seed(0)
    weight = torch.randn(300, 4 * GROUP, generator=g) * torch.rand(300, 1, generator=g)
    matrix = Q8Matrix(weight, kernel)
    dequantized = matrix.dequantized()
    blocks = weight.view(300, -1, GROUP).abs().amax(-1, keepdim=True)
    assert ((dequantized - weight).view(300, -1, GROUP).abs() <= blocks / 254 + 1e-7).all()  # half a step
    x = torch.randn(9, 4 * GROUP, generator=g)
    together = matrix(x)
    blocks = x.view(9, -1, GROUP).double()
    dx = blocks.abs().amax(-1, keepdim=True) / 127
    rounded = ((blocks / dx).round().clamp(-127, 127) * dx).view(9, -1)  # the input as the kernel rounds it
    torch.testing.assert_close(together.double(), rounded @ dequantized.double().t(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(together, x @ dequantized.t(), rtol=0, atol=0.05 * (x @ dequantized.t()).abs().max())
    for rows in (1, 2, 3, 4, 5, 8):
        assert torch.equal(matrix(x[:rows]), together[:rows]), rows
    for row in range(9):
        assert torch.equal(matrix(x[row : row + 1])[0], together[row]), row
    assert matrix(x.view(3, 3, -1)).shape == (3, 3, 300)


def test_q8_0_blocks_come_back_exactly(kernel):
    """A weight that is d * q with an fp16 d and int8 q reaching +-127 in each block (llama.cpp's Q8_0, the
    default model's embedding) is re-made into the same blocks."""
    g = torch.Generator().manual_seed(1)
    q = torch.randint(-126, 127, (64, 2 * GROUP), generator=g)
    q.view(64, -1, GROUP)[:, :, 5] = 127 * torch.where(torch.rand(64, 2, generator=g) < 0.5, -1, 1)
    d = torch.rand(64, 2, generator=g).half().float() / 100
    weight = (q.view(64, -1, GROUP) * d[..., None]).view(64, -1)
    matrix = Q8Matrix(weight, kernel)
    assert torch.equal(matrix.q.long(), q)
    assert torch.equal(matrix.dequantized(), weight)


def test_zero_blocks_give_zeros_and_bad_shapes_are_refused(kernel):
    matrix = Q8Matrix(torch.zeros(5, GROUP), kernel)
    assert torch.equal(matrix(torch.randn(2, GROUP)), torch.zeros(2, 5))
    with pytest.raises(ValueError, match="multiple of 32"):
        Q8Matrix(torch.randn(4, GROUP + 1), kernel)


class CountingHead:
    def __init__(self, matrix: Q8Matrix):
        self.matrix, self.calls = matrix, []

    def __call__(self, features: torch.Tensor) -> torch.Tensor:
        self.calls.append(features.shape[0])
        return self.matrix(features)


def chain_tree(matrix: Q8Matrix, features: torch.Tensor, vocab: int):
    """Root, two depth-1 nodes, then a chain of five under the better one whose first two tokens are the target's
    argmax (tree node = pool index + 1)."""
    predicted = matrix(features).argmax(-1).tolist()
    pool = DraftPool()
    pool.add(torch.tensor([predicted[0], (predicted[0] + 1) % vocab]), torch.tensor([-1, -1]),
             torch.tensor([-0.1, -2.0]), "gumiho", 1)
    parent = 0
    for depth in range(2, 7):
        token = predicted[parent + 1] + (0 if depth <= 3 else 1)
        parent = int(pool.add(torch.tensor([token % vocab]), torch.tensor([parent]), torch.tensor([-0.1 * depth]),
                              "gumiho", depth)[0])
    tree = build_tree(predicted[0], pool, total_tokens=8)
    assert tree.parents == [-1, 0, 0, 1, 3, 4, 5, 6]
    return tree


def test_the_greedy_walk_reads_the_likeliest_path_in_one_product_and_decides_as_one_row_walks_do(kernel):
    """A chain of six draft tokens under the root, and a sibling: with `together`, the root and the likeliest
    path's first PREFETCH_ROWS - 1 nodes are one product; the accepted path, the bonus token and every row read
    equal the one-row walk's."""
    vocab, hidden = 40, 2 * GROUP
    g = torch.Generator().manual_seed(2)
    matrix = Q8Matrix(torch.randn(vocab, hidden, generator=g), kernel)
    features = torch.randn(8, hidden, generator=g)
    tree = chain_tree(matrix, features, vocab)
    one_row, together = CountingHead(matrix), CountingHead(matrix)
    alone = walk_greedy(tree, LazyLogits(features, one_row))
    joint_logits = LazyLogits(features, together, together=True)
    joint = walk_greedy(tree, joint_logits)
    assert (joint.nodes, joint.bonus) == (alone.nodes, alone.bonus)
    assert len(alone.nodes) == 4  # three draft tokens accepted
    assert one_row.calls == [1, 1, 1, 1]
    assert together.calls == [PREFETCH_ROWS] + [1] * (len(alone.nodes) - PREFETCH_ROWS)
    rows, values = joint_logits.computed()
    for node, row in zip(rows, values):
        assert torch.equal(row, matrix(features[node : node + 1])[0]), node


def test_a_tree_of_all_rows_or_fewer_is_one_product_siblings_included(kernel):
    """Root and two candidates side by side (a first-level tree), the target's token the second one: with
    `together` the three rows are one product and the walk computes nothing more; path and bonus as one row at a
    time."""
    vocab, hidden = 40, 2 * GROUP
    g = torch.Generator().manual_seed(4)
    matrix = Q8Matrix(torch.randn(vocab, hidden, generator=g), kernel)
    features = torch.randn(3, hidden, generator=g)
    predicted = matrix(features).argmax(-1).tolist()
    pool = DraftPool()
    pool.add(torch.tensor([(predicted[0] + 1) % vocab, predicted[0]]), torch.tensor([-1, -1]),
             torch.tensor([-0.2, -0.9]), "eagle-1", 1)
    tree = build_tree(predicted[0], pool, total_tokens=ALL_ROWS)
    assert tree.parents == [-1, 0, 0]
    one_row, together = CountingHead(matrix), CountingHead(matrix)
    alone = walk_greedy(tree, LazyLogits(features, one_row))
    joint = walk_greedy(tree, LazyLogits(features, together, together=True))
    assert (joint.nodes, joint.bonus) == (alone.nodes, alone.bonus) == ([0, 2], predicted[2])
    assert one_row.calls == [1, 1] and together.calls == [3]


def test_the_sampling_walk_reads_the_same_rows_and_draws_the_same_tokens_with_one_product(kernel):
    vocab, hidden = 40, 2 * GROUP
    g = torch.Generator().manual_seed(3)
    matrix = Q8Matrix(torch.randn(vocab, hidden, generator=g), kernel)
    features = torch.randn(8, hidden, generator=g)
    tree = chain_tree(matrix, features, vocab)
    sampling = SamplingConfig(temperature=0.8)
    for seed in range(5):
        alone = verify_sampling(tree, LazyLogits(features, CountingHead(matrix)), sampling,
                                torch.Generator().manual_seed(seed))
        together = CountingHead(matrix)
        joint = verify_sampling(tree, LazyLogits(features, together, together=True), sampling,
                                torch.Generator().manual_seed(seed))
        assert (joint.nodes, joint.bonus, joint.tests) == (alone.nodes, alone.bonus, alone.tests), seed
        assert together.calls[0] == PREFETCH_ROWS


def test_every_instruction_set_gives_the_same_bits(kernel, tmp_path):
    """The integer dot products are exact, and the float steps the same, with VNNI, with AVX2 alone and in plain
    C++: a machine's outputs do not depend on which of them its processor has."""
    from torch.utils.cpp_extension import load

    source = str(kernels.HERE / "q8_matmul.cpp")
    builds = {"avx2": ["-O3", "-mavx2", "-mfma", "-mf16c"], "plain": ["-O3"]}
    g = torch.Generator().manual_seed(4)
    weight, x = torch.randn(700, 18 * GROUP, generator=g), torch.randn(5, 18 * GROUP, generator=g)
    matrix = Q8Matrix(weight, kernel)
    expected = matrix(x)
    for ahead, keep in int4.FETCHES:  # nor does how the weights are asked for
        assert torch.equal(kernel.q8_matmul(x, matrix.q, matrix.scale, ahead, keep), expected)
    for name, flags in builds.items():
        folder = tmp_path / name
        folder.mkdir()
        other = load(name=f"q8_{name}", sources=[source], extra_cflags=flags, build_directory=str(folder))
        assert torch.equal(other.q8_matmul(x, matrix.q, matrix.scale, AHEAD, KEEP), expected), name
