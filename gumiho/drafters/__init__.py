"""Pluggable drafters. Each one turns accepted (feature, token) pairs into a scored candidate pool."""

from __future__ import annotations

import torch

from .base import Drafter
from .config import DrafterConfig
from .eagle2 import Eagle2Drafter
from .gumiho import GumihoDrafter

DRAFTERS: dict[str, type[Drafter]] = {"eagle2": Eagle2Drafter, "gumiho": GumihoDrafter}

__all__ = ["DRAFTERS", "Drafter", "DrafterConfig", "Eagle2Drafter", "GumihoDrafter", "new_drafter"]


def new_drafter(kind: str, target_config, seed: int = 0, **overrides) -> Drafter:
    """A freshly initialised drafter shaped for `target_config` (a transformers config)."""
    torch.manual_seed(seed)
    return Drafter.from_config(DrafterConfig.for_target(kind, target_config, **overrides))
