"""A long prompt's bf16 products on AMX tiles (kernels/tile_matmul.cpp), where the processor has AMX-BF16.

oneDNN's bf16 matmul reaches 1.1-2.3 TFLOPS on a 763-token prompt's products of SmolLM2-135M on the 2-core Intel
Xeon with AMX, and reorders each weight at every call; packed once for the tiles, the same four products of a layer
take 2.7-2.9 ms against oneDNN's 3.5 plus the SiLU pass that the gated product here folds in. Which one a machine
takes is measured at load (`llama.LeanLlama._fastest_prefill`, the candidate `BF16_TILES`).
"""

from __future__ import annotations

import torch

from .kernels import tile_matmul


def tiles_available() -> bool:
    """Whether this machine's bf16 products can run on AMX tiles (the kernel built, the OS granting the tiles)."""
    return tile_matmul() is not None


def tiles_fit(weight: torch.Tensor) -> bool:
    """Whether `weight` [N, K] has the shape the tiles take: N and K multiples of 32 (so a stacked gate and up
    projection's halves are whole blocks of 16 columns)."""
    n, k = weight.shape
    return k % 32 == 0 and n % 32 == 0


class TileMatrix:
    """`x @ W.T (+ bias)` with W in bf16, packed once for AMX tiles; the result rounded to bf16 as torch rounds, then
    in x's dtype (a bf16 prefill's rows stay bf16). `gated`: W stacks a gate and an up projection ([2I, K]) and the
    matrix gives only their SiLU-gated product, silu(x G^T) * (x U^T) [.., I], from the fp32 sums in the same pass
    (`gated_product`)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None, gated: bool = False):
        if not tiles_available() or not tiles_fit(weight):
            raise ValueError("TileMatrix needs AMX tiles and a weight whose sides are multiples of 32")
        self.gated = gated
        self.in_features = weight.shape[1]
        self.packed = tile_matmul().pack(weight.detach().to(torch.bfloat16).contiguous(), gated)
        self.bias = torch.empty(0) if bias is None else bias.detach().float().contiguous()

    def _product(self, x: torch.Tensor, gated: bool) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1]).to(torch.bfloat16)
        # the kernel module asked for at each call (cached), not kept: a matrix stays copyable (copy.deepcopy)
        y = tile_matmul().matmul(rows, self.packed, self.bias, gated)
        return y.view(*x.shape[:-1], y.shape[-1]).to(x.dtype)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.gated:
            raise TypeError("a gated TileMatrix gives its gated product only (gated_product)")
        return self._product(x, False)

    def gated_product(self, x: torch.Tensor) -> torch.Tensor:
        return self._product(x, True)
