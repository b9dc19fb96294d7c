"""Int4 weight-only matrix products on CPU: 4-bit weights in blocks of 32 (GGUF's Q4_1: w = d * q + m).

Why: a decode step is memory-bound, and 4-bit weights are an eighth of fp32's bytes. Two kernels compute with
such weights, and `Int4Matrix` takes the first that is there:

- kernels/q4_matmul.cpp (ours, compiled on first use): the activations rounded to 8 bits per block of 32, exact
  integer dot products (VNNI where the processor has it), fp32 scales. It is llama.cpp's arithmetic for a Q4_1
  file. On a 2-core Zen 4 EPYC, the 120 products of a SmolLM2-135M forward cost 2.6 ms for one row, 4.2 for four
  and 7.5 for eight, against 5.2, 7.9 and 13.2 with torch's kernel (scripts/q4_bench.py).
- torch's `_weight_int4pack_mm_for_cpu`: bf16 activations, scale s and zero z per group with w = (q - 8) * s + z,
  which is Q4_1 with s = d and z = m + 8d rounded to bf16. It is fast only with bf16 activations, so the input is
  cast to bf16 and the output back.

The default model's own 4-bit values are used as they are (`from_q4_1`); another model's float weights are made
into such blocks (`quantize`), and the profile reports what that costs in output agreement. Either kernel computes
each row the same way whatever the number of rows, and so does the row-consistent attention (kernels/), so a tree
verification gives each node the logits a one-row step would: greedy speculation on this path equals this path's
AR token for token.
"""

from __future__ import annotations

import statistics
import time
from functools import lru_cache
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F

from .kernels import q4_matmul

GROUP = 32
ROWS = 16  # torch's kernel packs output rows 16 at a time: a matrix with fewer is padded with zero rows
INNER_K_TILES = 2  # the packing's tile width along the input dimension; 2 fits every K that is a multiple of 32
Q4_1_BLOCK_BYTES = 20  # fp16 d, fp16 m, 16 bytes of nibbles
RECORD_ROWS = 8  # output rows per record of kernels/q4_matmul.cpp
# How our kernels ask for a matrix's next weights: AHEAD bytes ahead of their reads (0: never), into every cache level
# where KEEP, else non-temporally (kernels/simd.h, Fetch). A decode step reads every weight once; asked for a page
# or two ahead, the 8-bit lm_head and the 4-bit layers arrive sooner: on the 2-core AMD EPYC Zen 5, AR 168 -> 212
# tokens/s (4 KB to 16 KB all alike; docs/benchmarks.md, "Weights asked for ahead"). Kept in the caches, a step
# finds there what the step before read, where the last-level cache holds the model: on the 2-core Intel Xeon of
# family 6, model 207 (320 MB of L3), a step's 4-bit products 6.5 -> 3.0 ms. Both are the memory system's, so each
# load measures them (`fastest_fetch`, llama.LeanLlama): AHEAD and KEEP hold this process's, the defaults until then.
AHEAD = 8192
KEEP = False
FetchSetting = tuple[int, bool]  # (AHEAD, KEEP)
FETCHES: tuple[FetchSetting, ...] = ((0, False),) + tuple((ahead, keep) for keep in (False, True) for ahead in (4096, 8192, 16384))
# Keeping is taken only where it beats the fastest streaming by this share. Where the model does not fit the cache,
# the two cost the products about the same, and streaming leaves the rest of a cycle's data in the caches: on the
# Zen 5 EPYC streaming was 1.04-1.06x faster for the drafters' methods than keeping, which the products alone
# (this measurement) cannot see.
KEEP_MARGIN = 0.1


def fastest_fetch(step: Callable[[], object], repeats: int = 5) -> tuple[FetchSetting, dict[FetchSetting, float]]:
    """The (AHEAD, KEEP) of FETCHES at which `step` (a decode step's 4-bit products, one row each) is fastest,
    keeping only by KEEP_MARGIN, and each one's median ms, the settings interleaved in each repeat. Each timed step
    follows an untimed one with the same setting, so it meets the caches as that setting leaves them from step to
    step (a streaming step right after a keeping one finds the weights kept). How the weights are asked for changes
    no number, only the time."""
    global AHEAD, KEEP
    chosen, times = (AHEAD, KEEP), {fetch: [] for fetch in FETCHES}
    try:
        for repeat in range(repeats):
            for fetch in FETCHES[repeat % len(FETCHES):] + FETCHES[: repeat % len(FETCHES)]:
                AHEAD, KEEP = fetch
                step()
                start = time.perf_counter()
                step()
                times[fetch].append((time.perf_counter() - start) * 1e3)
    finally:
        AHEAD, KEEP = chosen
    medians = {fetch: statistics.median(ms) for fetch, ms in times.items()}
    streaming = min((fetch for fetch in medians if not fetch[1]), key=medians.get)
    keeping = min((fetch for fetch in medians if fetch[1]), key=medians.get)
    best = keeping if medians[keeping] < (1 - KEEP_MARGIN) * medians[streaming] else streaming
    return best, medians


def fetch_text(fetch: FetchSetting) -> str:
    """How the 4-bit products ask for their weights, in the words of the bench's reports."""
    ahead, keep = fetch
    if not ahead:
        return "weights not asked for ahead"
    return f"weights {'kept in the caches' if keep else 'streamed'}, asked for {ahead // 1024} KB ahead"


@lru_cache(maxsize=None)
def torch_int4_available() -> bool:
    """Whether this torch has the CPU int4 weight-only kernel (tried once on a small matrix)."""
    try:
        q = torch.zeros(32, 64, dtype=torch.int32)
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, INNER_K_TILES)
        zs = torch.zeros(64 // GROUP, 32, 2, dtype=torch.bfloat16)
        torch.ops.aten._weight_int4pack_mm_for_cpu(torch.zeros(1, 64, dtype=torch.bfloat16), packed, GROUP, zs)
    except (RuntimeError, AttributeError):
        return False
    return True


def int4_available() -> bool:
    """Whether 4-bit products run here: our kernel builds, or torch has its own."""
    return q4_matmul() is not None or torch_int4_available()


def activations() -> str:
    """What the activations are rounded to at a 4-bit product: 'int8' (our kernel) or 'bf16' (torch's)."""
    return "int8" if q4_matmul() is not None else "bf16"


class Int4Matrix:
    """`x @ W.T (+ bias)` with W held as 4-bit values, a scale d and a minimum m per block of 32 inputs."""

    def __init__(self, q: torch.Tensor, d: torch.Tensor, m: torch.Tensor, bias: torch.Tensor | None = None):
        """`q` [out, in] integers 0..15; `d`, `m` [out, in / 32]: w = d * q + m (rounded to fp16 for our kernel,
        to bf16 for torch's)."""
        out_features, in_features = q.shape
        if in_features % GROUP:
            raise ValueError(f"int4 weights need an input size that is a multiple of {GROUP}, got {in_features}")
        self.out_features, self.in_features = out_features, in_features
        self.bias = bias
        self.kernel = q4_matmul()
        if self.kernel is not None:
            self.records = q4_records(q, d, m)
            return
        pad = -out_features % ROWS
        q, scale, zero = (F.pad(t, (0, 0, 0, pad)) for t in (q.to(torch.int32), d, m + 8 * d))
        self.packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.contiguous(), INNER_K_TILES)
        self.scales_and_zeros = torch.stack([scale.t(), zero.t()], -1).to(torch.bfloat16).contiguous()

    @classmethod
    def quantize(cls, weight: torch.Tensor, bias: torch.Tensor | None = None) -> Int4Matrix:
        """Asymmetric 4-bit blocks of 32 (Q4_1's recipe: d = (max - min) / 15, m = min) of a float weight."""
        w = weight.detach().float().reshape(weight.shape[0], -1, GROUP)
        low, high = w.amin(-1), w.amax(-1)
        d = (high - low) / 15
        safe = torch.where(d > 0, d, torch.ones_like(d))
        q = ((w - low[..., None]) / safe[..., None]).round().clamp(0, 15).reshape(weight.shape)
        return cls(q, d, low, bias)

    @classmethod
    def from_q4_1(cls, blocks: np.ndarray, bias: torch.Tensor | None = None) -> Int4Matrix:
        """From GGUF Q4_1 rows: `blocks` uint8 [out, in / 32 * 20]."""
        return cls(*unpack_q4_1(blocks), bias)

    def dequantized(self) -> torch.Tensor:
        """The weight this matrix multiplies by, in fp32 (its scales and minimums as the kernel rounds them)."""
        if self.kernel is not None:
            q, d, m = unpack_records(self.records, self.in_features)
            weight = q.float().view(q.shape[0], -1, GROUP) * d[..., None] + m[..., None]
            return weight.view(q.shape)[: self.out_features]
        eye = torch.eye(self.in_features, dtype=torch.bfloat16)
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(eye, self.packed, GROUP, self.scales_and_zeros)
        return y[:, : self.out_features].float().t().contiguous()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        # A decode step makes 120 of these calls: each Python-level operation skipped here saves about 0.1 ms a step
        rows = x.view(-1, self.in_features) if x.is_contiguous() else x.reshape(-1, self.in_features)
        if self.kernel is not None:
            y = self.kernel.q4_matmul(rows if rows.dtype == torch.float32 else rows.float(), self.records, AHEAD, KEEP)
        else:
            y = torch.ops.aten._weight_int4pack_mm_for_cpu(rows.to(torch.bfloat16), self.packed, GROUP,
                                                           self.scales_and_zeros)
        if y.shape[1] != self.out_features:
            y = y[:, : self.out_features]
        if y.dtype != x.dtype:
            y = y.to(x.dtype)
        if self.bias is not None:
            y = y + self.bias
        return y if x.dim() == 2 else y.view(*x.shape[:-1], self.out_features)


class Int4Stack:
    """`x[i] @ W[i] + b[i]` for a stack of (in, out) matrices, as MLP heads store them (`drafters/heads.py`): all of
    them in one kernel call where ours is built, one product each otherwise."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor):
        """`weight` [n, in, out], `bias` [n, out]."""
        self.matrices = [Int4Matrix.quantize(w.t(), b.detach()) for w, b in zip(weight.detach(), bias)]
        self.kernel = q4_matmul()
        if self.kernel is not None:
            self.records = torch.stack([m.records for m in self.matrices])
            for i, matrix in enumerate(self.matrices):  # views into the stack: the blocks are held once
                matrix.records = self.records[i]
            self.bias = bias.detach().clone()

    def __call__(self, x: torch.Tensor, which: slice) -> torch.Tensor:
        """x [n, R, in] -> [n, R, out], row block i through matrix which.start + i."""
        if self.kernel is None:
            return torch.stack([m(rows) for m, rows in zip(self.matrices[which], x)])
        out = self.matrices[0].out_features
        y = self.kernel.q4_matmul(x.float(), self.records[which], AHEAD, KEEP)
        return (y if y.shape[-1] == out else y[..., :out]).to(x.dtype) + self.bias[which, None]


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
    weight gives them back exactly; the input is rounded to 8 bits per block of 32 as llama.cpp's Q8_0 products
    round it (the fp16 head this replaced was off by up to 1e-2). Every row is computed as it would be alone, and
    a further row costs a fraction of the first: a verification can read its rows together."""

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
        y = self.kernel.q8_matmul(x.reshape(-1, shape[-1]).float(), self.q, self.scale, AHEAD, KEEP).to(x.dtype)
        return y.reshape(*shape[:-1], self.q.shape[0])


class Int4Linear(torch.nn.Module):
    """An inference-only stand-in for an nn.Linear, computing through `Int4Matrix` (no parameters, no grad)."""

    def __init__(self, linear: torch.nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.matrix = Int4Matrix.quantize(linear.weight, None if linear.bias is None else linear.bias.detach())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.matrix(x)


def quantize_linears(module: torch.nn.Module, skip: tuple[torch.nn.Module, ...] = ()) -> int:
    """Swap every nn.Linear under `module` (not under `skip`) whose input size is a multiple of 32 for an
    Int4Linear, and give the MLP heads' stacked weights their 4-bit stacks (modules with a `to_int4`); returns how
    many were changed. For inference copies only: the swapped layers no longer train."""
    swapped = 0
    for name, child in list(module.named_children()):
        if any(child is s for s in skip):
            continue
        if isinstance(child, torch.nn.Linear) and child.in_features % GROUP == 0:
            setattr(module, name, Int4Linear(child))
            swapped += 1
            continue
        if hasattr(child, "to_int4"):
            child.to_int4()
            swapped += 1
        swapped += quantize_linears(child, skip)
    return swapped


def q4_records(q: torch.Tensor, d: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """Q4_1 weights (q [N, K] 0..15, d and m [N, K / 32]) regrouped as kernels/q4_matmul.cpp reads them: uint8
    [N / 8, K / 32 * 160], a record per 8 output rows and block (d and m rounded to fp16; N padded with zero rows)."""
    n, k = q.shape
    pad = -n % RECORD_ROWS
    q = F.pad(q.to(torch.uint8), (0, 0, 0, pad)).reshape(-1, RECORD_ROWS, k // GROUP, 2, 4, 4)  # [g, v, b, h, c, t]
    nibbles = (q[:, :, :, 0] | (q[:, :, :, 1] << 4)).permute(0, 2, 3, 1, 4)  # [g, b, c, v, t]
    scales = [F.pad(t.to(torch.float16), (0, 0, 0, pad)).reshape(-1, RECORD_ROWS, k // GROUP).transpose(1, 2)
              for t in (d, m)]
    halves = torch.cat(scales, -1).contiguous().view(torch.uint8)  # [g, b, 32]: the 8 d's, then the 8 m's
    return torch.cat([halves, nibbles.reshape(*halves.shape[:2], 128)], -1).reshape(halves.shape[0], -1).contiguous()


def unpack_records(records: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`q4_records`' inverse: (q [N, K] uint8, d and m [N, K / 32] fp32), N a multiple of 8."""
    r = records.reshape(records.shape[0], k // GROUP, 160)
    halves = r[..., :32].contiguous().view(torch.float16).float().reshape(*r.shape[:2], 2, RECORD_ROWS)
    d, m = (halves[:, :, i].transpose(1, 2).reshape(-1, k // GROUP) for i in (0, 1))
    nibbles = r[..., 32:].reshape(*r.shape[:2], 4, RECORD_ROWS, 4).permute(0, 3, 1, 2, 4)  # [g, v, b, c, t]
    q = torch.stack([nibbles & 0x0F, nibbles >> 4], 3)  # [g, v, b, h, c, t]
    return q.reshape(-1, k), d, m
