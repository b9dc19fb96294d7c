"""Residual MLP heads that predict a target feature from the target's own last feature: Medusa's and Hydra's.

A residual block is a + SiLU(W a + b). As in the papers, W starts at zero (a head starts as the identity plus
SiLU(b)) and b keeps nn.Linear's default initialisation. Weights are stored stacked per head, [heads, blocks, H, H]
as (in, out) matrices, so that several heads run in one batched call. A head's output is a predicted feature, scored
with the target's lm_head (`Drafter.top_tokens`): no head has an lm_head of its own.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..int4 import Int4Stack


def linear_bias(n: int, fan_in: int, size: int) -> torch.Tensor:
    """n bias vectors with nn.Linear's default initialisation."""
    bound = 1 / fan_in**0.5
    return torch.empty(n, size).uniform_(-bound, bound)


def residual_blocks(a: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, heads: slice,
                    int4: list[Int4Stack] | None = None) -> torch.Tensor:
    """a [n, R, H] through the blocks of heads `heads` (n of them): weight [all heads, blocks, H, H], bias [all heads,
    blocks, H]; or through `int4`, the same blocks in 4 bits (`int4_blocks`), where an inference copy has them."""
    for k in range(weight.shape[1]):
        z = int4[k](a, heads) if int4 else torch.baddbmm(bias[heads, k, None], a, weight[heads, k])
        a = a + F.silu(z)
    return a


def int4_blocks(weight: torch.Tensor, bias: torch.Tensor) -> list[Int4Stack]:
    """Block k of every head as one 4-bit stack, for the int4 path's inference copies: the heads read 4x fewer bytes
    than in fp32 (Gumiho's five heads of five blocks hold 11.6M weights, 46 MB in fp32) and run in one call each."""
    return [Int4Stack(weight[:, k], bias[:, k]) for k in range(weight.shape[1])]


class StackedBlocks(nn.Module):
    """`blocks` residual blocks H -> H for each of `heads` heads."""

    def __init__(self, heads: int, blocks: int, hidden: int):
        super().__init__()
        self.block_weight = nn.Parameter(torch.zeros(heads, blocks, hidden, hidden))
        self.block_bias = nn.Parameter(torch.stack([linear_bias(blocks, hidden, hidden) for _ in range(heads)]))
        self.int4: list[Int4Stack] | None = None  # set by to_int4

    def to_int4(self) -> None:
        """For an inference copy on the int4 path: the blocks in 4 bits; the float weights are no longer read."""
        self.int4 = int4_blocks(self.block_weight, self.block_bias)

    def forward(self, a: torch.Tensor, heads: slice) -> torch.Tensor:
        """a [n, R, H] -> [n, R, H], row block i through head heads.start + i."""
        return residual_blocks(a, self.block_weight, self.block_bias, heads, self.int4)


class MedusaHeads(StackedBlocks):
    """Medusa-1's heads: head m is `blocks` residual blocks on the feature f_j; it predicts f_{j+m+1}, the feature
    whose lm_head distribution is that of token x_{j+m+2} (m + 1 tokens after the root x_{j+1})."""

    def forward(self, features: torch.Tensor, heads: slice = slice(None)) -> torch.Tensor:
        """features [R, H] -> [len(heads), R, H]: every selected head on every row, in one batched call."""
        n = len(range(*heads.indices(self.block_weight.shape[0])))
        return super().forward(features.expand(n, -1, -1), heads)


class HydraHeads(nn.Module):
    """Hydra's sequentially dependent heads. Head k reads u = [f_j ; e(x_{j+1}) ; e(d_1) ; ... ; e(d_k)], the target
    feature with the embeddings of the root and of the k draft tokens before the one it predicts ((k + 2) H wide).
    Its first block maps u to H with a linear skip connection, skip(u) + SiLU(W u + b); then `blocks - 1` residual
    blocks H -> H.

    The official code builds a head's later blocks by list multiplication, `[ResBlock(H)] * (n - 1)`: one module
    repeated, so they all share one weight matrix, which looks accidental (Medusa's code has the same idiom). Here
    each block has its own weights. At the papers' default of one block per head the two are the same; with more,
    ours can still hold an official head (the shared block copied into each) and can also learn distinct blocks.
    """

    def __init__(self, heads: int, blocks: int, hidden: int):
        super().__init__()
        widths = [(k + 2) * hidden for k in range(heads)]
        self.first = nn.ModuleList(nn.Linear(w, hidden) for w in widths)
        self.skip = nn.ModuleList(nn.Linear(w, hidden) for w in widths)
        for layer in self.first:
            nn.init.zeros_(layer.weight)
        self.rest = StackedBlocks(heads, blocks - 1, hidden)

    def forward(self, u: torch.Tensor, head: int) -> torch.Tensor:
        """u [R, (head + 2) H] -> head `head`'s predicted feature [R, H]."""
        a = self.skip[head](u) + F.silu(self.first[head](u))
        return self.rest(a[None], slice(head, head + 1))[0]
