"""Int4 weight-only matrix products on CPU: 4-bit weights in groups of 32, bf16 activations at the product.

Why: a decode step is memory-bound, and 4-bit weights are an eighth of fp32's bytes. torch's
`_weight_int4pack_mm_for_cpu` reads weights packed from 4-bit values q in groups along the input dimension, each
group with a scale s and a zero z, and computes with w = (q - 8) * s + z. That is exactly the layout of GGUF's
Q4_1 blocks (32 weights, a scale d and a minimum m, w = d * q + m) with s = d and z = m + 8d, so the default
model's own 4-bit values are used as they are; only d and m are rounded to bf16. For another model, `quantize`
makes the same kind of blocks from its float weights (asymmetric, min/max per group of 32), and the profile
reports what that costs in output agreement.

The kernel is fast only with bf16 activations (fp32 and fp16 fall onto a reference loop 10-20x slower here), so
`Int4Matrix` casts its input to bf16 and its output back: the rest of the forward (norms, attention, the
residual stream) keeps its own dtype. It computes each row the same way whatever the number of rows, and so does
the row-consistent attention (kernels/), so a tree verification gives each node the logits a one-row step would:
greedy speculation on this path equals this path's AR token for token.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import torch
import torch.nn.functional as F

GROUP = 32
ROWS = 16  # the kernel packs output rows 16 at a time: a matrix with fewer is padded with zero rows
INNER_K_TILES = 2  # the packing's tile width along the input dimension; 2 fits every K that is a multiple of 32
Q4_1_BLOCK_BYTES = 20  # fp16 d, fp16 m, 16 bytes of nibbles


@lru_cache(maxsize=None)
def int4_available() -> bool:
    """Whether this torch has the CPU int4 weight-only kernel (tried once on a small matrix)."""
    try:
        q = torch.zeros(32, 64, dtype=torch.int32)
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, INNER_K_TILES)
        zs = torch.zeros(64 // GROUP, 32, 2, dtype=torch.bfloat16)
        torch.ops.aten._weight_int4pack_mm_for_cpu(torch.zeros(1, 64, dtype=torch.bfloat16), packed, GROUP, zs)
    except (RuntimeError, AttributeError):
        return False
    return True


class Int4Matrix:
    """`x @ W.T (+ bias)` with W held as 4-bit values, a scale and a zero per group of 32 inputs."""

    def __init__(self, q: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, bias: torch.Tensor | None = None):
        """`q` [out, in] integers 0..15; `scale`, `zero` [out, in / 32]: w = (q - 8) * scale + zero."""
        out_features, in_features = q.shape
        if in_features % GROUP:
            raise ValueError(f"int4 weights need an input size that is a multiple of {GROUP}, got {in_features}")
        self.out_features, self.in_features = out_features, in_features
        pad = -out_features % ROWS
        q, scale, zero = (F.pad(t, (0, 0, 0, pad)) for t in (q.to(torch.int32), scale, zero))
        self.packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.contiguous(), INNER_K_TILES)
        self.scales_and_zeros = torch.stack([scale.t(), zero.t()], -1).to(torch.bfloat16).contiguous()
        self.bias = bias

    @classmethod
    def quantize(cls, weight: torch.Tensor, bias: torch.Tensor | None = None) -> Int4Matrix:
        """Asymmetric 4-bit blocks of 32 (Q4_1's recipe: d = (max - min) / 15, m = min) of a float weight."""
        w = weight.detach().float().reshape(weight.shape[0], -1, GROUP)
        low, high = w.amin(-1), w.amax(-1)
        d = (high - low) / 15
        safe = torch.where(d > 0, d, torch.ones_like(d))
        q = ((w - low[..., None]) / safe[..., None]).round().clamp(0, 15).reshape(weight.shape)
        return cls(q, d, low + 8 * d, bias)

    @classmethod
    def from_q4_1(cls, blocks: np.ndarray, bias: torch.Tensor | None = None) -> Int4Matrix:
        """From GGUF Q4_1 rows: `blocks` uint8 [out, in / 32 * 20]."""
        q, d, m = unpack_q4_1(blocks)
        return cls(q, d, m + 8 * d, bias)

    def dequantized(self) -> torch.Tensor:
        """The weight this matrix multiplies by, in fp32 (its scales and zeros as rounded to bf16)."""
        eye = torch.eye(self.in_features, dtype=torch.bfloat16)
        return self._mm(eye).float().t().contiguous()

    def _mm(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(x, self.packed, GROUP, self.scales_and_zeros)
        return y if y.shape[-1] == self.out_features else y[:, : self.out_features]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        y = self._mm(x.reshape(-1, shape[-1]).to(torch.bfloat16)).to(x.dtype)
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*shape[:-1], self.out_features)


def unpack_q4_1(blocks: np.ndarray) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """GGUF Q4_1 rows -> (q [out, in] uint8 0..15, d [out, in/32] fp32, m [out, in/32] fp32).

    A block is fp16 d, fp16 m, then 16 bytes: byte j holds weight j in its low nibble and weight j + 16 in its
    high nibble."""
    rows = blocks.shape[0]
    b = np.ascontiguousarray(blocks).reshape(rows, -1, Q4_1_BLOCK_BYTES)
    d = b[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
    m = b[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32)
    nibbles = b[..., 4:]
    q = np.concatenate([nibbles & 0x0F, nibbles >> 4], -1).reshape(rows, -1)
    return torch.from_numpy(q.copy()), torch.from_numpy(d), torch.from_numpy(m)


class CastMatrix:
    """`x @ W.T (+ bias)` with W kept in another dtype (the int4 path's bf16 lm_head, its bf16 prefill): the input
    is cast to it, the output back. One matmul per call; bf16 `F.linear` gives each row the same result whatever
    the row count."""

    def __init__(self, weight: torch.Tensor, dtype: torch.dtype, bias: torch.Tensor | None = None):
        self.weight = weight.detach().to(dtype)
        self.bias = bias

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.nn.functional.linear(x.to(self.weight.dtype), self.weight).to(x.dtype)
        return y if self.bias is None else y + self.bias


class Q8Matrix:
    """`x @ W.T` with W held as 8-bit blocks of 32 along its rows, one fp32 scale each (Q8_0's recipe: d = absmax
    / 127, q = round(w / d)), through kernels/q8_matmul.cpp; the int4 path's lm_head.

    The default model's tied embedding is stored as Q8_0 in its GGUF, so re-making the blocks from the loaded
    weight gives them back exactly and the product is the model's own to fp32 rounding (the fp16 head it replaces
    was off by up to 1e-2). One row costs about two-thirds of that fp16 head, four rows about as much as one and a
    half, and every row is computed as it would be alone: a verification can read its rows together."""

    def __init__(self, weight: torch.Tensor, kernel):
        rows, columns = weight.shape
        if columns % GROUP:
            raise ValueError(f"8-bit blocks need an input size that is a multiple of {GROUP}, got {columns}")
        w = weight.detach().float().reshape(rows, -1, GROUP)
        scale = w.abs().amax(-1) / 127
        safe = torch.where(scale > 0, scale, torch.ones_like(scale))
        self.q = (w / safe[..., None]).round().clamp(-127, 127).to(torch.int8).reshape(rows, columns)
        self.scale = scale.contiguous()
        self.kernel = kernel

    def dequantized(self) -> torch.Tensor:
        return (self.q.float().reshape(self.scale.shape[0], -1, GROUP) * self.scale[..., None]).flatten(1)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        y = self.kernel.q8_matmul(x.reshape(-1, shape[-1]).float(), self.q, self.scale).to(x.dtype)
        return y.reshape(*shape[:-1], self.q.shape[0])


class Int4Linear(torch.nn.Module):
    """An inference-only stand-in for an nn.Linear, computing through `Int4Matrix` (no parameters, no grad)."""

    def __init__(self, linear: torch.nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.matrix = Int4Matrix.quantize(linear.weight, None if linear.bias is None else linear.bias.detach())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.matrix(x)


def quantize_linears(module: torch.nn.Module) -> int:
    """Swap every nn.Linear under `module` whose input size is a multiple of 32 for an Int4Linear; returns how
    many. For inference copies only: the swapped layers no longer train."""
    swapped = 0
    for name, child in list(module.named_children()):
        if isinstance(child, torch.nn.Linear) and child.in_features % GROUP == 0:
            setattr(module, name, Int4Linear(child))
            swapped += 1
        else:
            swapped += quantize_linears(child)
    return swapped
