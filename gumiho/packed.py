"""oneDNN-packed fp32 and bf16 matrix products for inference on CPU.

The default fp32 `F.linear` path can be slow for the shapes speculative decoding lives on: 1 row (a decode step)
and 2-64 rows (a tree verification, a draft step). Packing each weight once into oneDNN's blocked layout helps on
some processors and hurts on others, so the machine profile (`gumiho/profile.py`) measures both and the engine
uses what it chose. Results equal `F.linear` up to fp32 rounding.

The packed copy is an inference-only cache next to the ordinary weight: forwards that autograd must track, other
devices or dtypes, and a weight changed in place (an optimizer step) use `F.linear`, so state_dict, `.to()` and
training are untouched; under autocast `F.linear` runs, so autocast picks the dtype. Set ``GUMIHO_PACKED=0`` to
switch packing off.
"""

from __future__ import annotations

import os
from functools import lru_cache

import torch
from torch import nn
from torch.nn import functional as F

BATCH_HINT = 16  # oneDNN picks its blocking for this many rows; 16 was as fast as 1 for one row and best for 4-24


def packing_enabled() -> bool:
    return (os.environ.get("GUMIHO_PACKED", "1") != "0" and torch.backends.mkldnn.is_available()
            and hasattr(torch.ops.mkldnn, "_reorder_linear_weight"))


def packs(dtype: torch.dtype) -> bool:
    """Whether packed matmuls run for `dtype` weights here: fp32 everywhere oneDNN is; bf16 only where the processor
    has the instructions oneDNN's bf16 path needs (AVX512-BW/VL/DQ or AVX-NE-CONVERT; an AVX2-only CPU has not).
    Whether bf16 *pays* is the machine profile's question."""
    return packing_enabled() and _oneDNN_packs(dtype)


@lru_cache(maxsize=None)
def _oneDNN_packs(dtype: torch.dtype) -> bool:
    """Tried once on a small matrix."""
    if dtype not in (torch.float32, torch.bfloat16):
        return False
    try:
        torch.ops.mkldnn._reorder_linear_weight(torch.zeros(16, 16, dtype=dtype), BATCH_HINT)
    except RuntimeError:
        return False
    return True


class PackedMatrix:
    """`x @ weight.T (+ bias)` that uses a oneDNN-packed copy of `weight` for CPU fp32 / bf16 inference."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None, pack: bool = True):
        self.weight, self.bias, self.pack = weight, bias, pack
        self._packed: torch.Tensor | None = None
        self._key: tuple | None = None

    def _current_key(self) -> tuple:
        w = self.weight
        return w.data_ptr(), 0 if w.is_inference() else w._version, w.shape  # inference tensors have no version

    def _usable(self, x: torch.Tensor) -> bool:
        w = self.weight
        needs_grad = torch.is_grad_enabled() and (w.requires_grad or x.requires_grad)
        autocasting = torch.is_autocast_enabled(w.device.type)  # F.linear lets autocast pick the matmul's dtype
        return (self.pack and not needs_grad and not autocasting and w.device.type == "cpu"
                and x.dtype == w.dtype and packs(w.dtype))

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if not self._usable(x):
            return F.linear(x, self.weight, self.bias)
        key = self._current_key()
        if key != self._key:
            self._packed = torch.ops.mkldnn._reorder_linear_weight(self.weight.detach(), BATCH_HINT)
            self._key = key
        bias = None if self.bias is None else self.bias.detach()
        return torch.ops.mkldnn._linear_pointwise(x, self._packed, bias, "none", [], "")


class PackedLinear(nn.Linear):
    """An nn.Linear (same parameters, same state_dict) whose inference forwards go through `PackedMatrix`."""

    @classmethod
    def wrap(cls, linear: nn.Linear) -> PackedLinear:
        packed = cls.__new__(cls)
        nn.Module.__init__(packed)
        packed.in_features, packed.out_features = linear.in_features, linear.out_features
        packed.weight, packed.bias = linear.weight, linear.bias  # the same Parameter objects, no copy
        return packed

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        matrix = self.__dict__.get("_matrix")
        if matrix is None or matrix.weight is not self.weight or matrix.bias is not self.bias:
            matrix = self.__dict__["_matrix"] = PackedMatrix(self.weight, self.bias)
        return matrix(x)


def pack_linears(module: nn.Module, skip: tuple[nn.Module, ...] = ()) -> int:
    """Swap every plain nn.Linear under `module` (not under `skip`) for a PackedLinear sharing its parameters;
    returns how many."""
    swapped = 0
    for name, child in list(module.named_children()):
        if any(child is s for s in skip):
            continue
        if type(child) is nn.Linear:
            setattr(module, name, PackedLinear.wrap(child))
            swapped += 1
        else:
            swapped += pack_linears(child, skip)
    return swapped
