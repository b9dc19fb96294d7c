"""bf16 autocast for data preparation and training where the hardware has bf16 units.

On a CPU with bf16 dot products (AVX512-BF16, AMX) a bf16 prefill runs 2-3x faster than fp32, and training
matmuls gain alike. Autocast runs the matmuls in bf16 while the weights, the optimizer and the losses (computed
in fp32 by `losses.py`) keep full precision. GPUs train in fp32 with TF32 matmuls (`trainer.py`), so 'auto' leaves
them alone.
"""

from __future__ import annotations

import contextlib

import torch

from ..errors import GumihoError
from ..profile import bf16_units

MODES = ("auto", "bf16", "off")


def uses_bf16(device: torch.device, mode: str) -> bool:
    if mode not in MODES:
        raise GumihoError(f"--autocast must be one of {', '.join(MODES)}, got {mode!r}")
    return mode == "bf16" or (mode == "auto" and device.type == "cpu" and bool(bf16_units(device)))


def autocast(device: torch.device, mode: str) -> contextlib.AbstractContextManager:
    """bf16 autocast on `device` when `uses_bf16`, else a no-op context."""
    if not uses_bf16(device, mode):
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=torch.bfloat16)
