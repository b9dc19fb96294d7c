"""Pluggable drafters. Each one turns accepted (feature, token) pairs into a scored candidate pool."""

from __future__ import annotations

from dataclasses import replace

import torch

from ..errors import GumihoError
from .base import Drafter, FeatureDrafter, HeadDrafter
from .config import DrafterConfig
from .eagle1 import Eagle1Drafter
from .eagle2 import Eagle2Drafter
from .gumiho import GumihoDrafter
from .hydra import HydraDrafter
from .medusa import MedusaDrafter
from .mjsd import MjsdDrafter

DRAFTERS: dict[str, type[Drafter]] = {"medusa": MedusaDrafter, "hydra": HydraDrafter, "eagle2": Eagle2Drafter,
                                      "gumiho": GumihoDrafter}
# Methods that draft with another method's trained network: method -> (its drafter class, the weights' kind).
BORROWED: dict[str, type[Drafter]] = {"eagle1": Eagle1Drafter, "mjsd": MjsdDrafter}

__all__ = ["BORROWED", "DRAFTERS", "Drafter", "DrafterConfig", "Eagle1Drafter", "Eagle2Drafter", "FeatureDrafter",
           "GumihoDrafter", "HeadDrafter", "HydraDrafter", "MedusaDrafter", "MjsdDrafter", "for_method", "new_drafter",
           "weights_kind"]


def weights_kind(method: str) -> str:
    """The kind of drafter folder `method` loads (EAGLE-1 and MJSD draft with EAGLE-2's network)."""
    return BORROWED[method].weights if method in BORROWED else method


def for_method(drafter: Drafter, method: str) -> Drafter:
    """`drafter` as the drafter of `method`: itself, or its weights in the method's class (EAGLE-1 from an
    EAGLE-2 drafter), with the method's own acceptance statistics."""
    if method not in BORROWED or drafter.kind == method:
        return drafter
    cls = BORROWED[method]
    if drafter.kind != cls.weights:
        raise GumihoError(f"{method} drafts with a {cls.weights} drafter's weights, not a {drafter.kind} drafter's")
    config = replace(drafter.config, kind=method)
    twin = cls(config)
    twin.load_state_dict(drafter.state_dict())
    twin.acceptance = drafter.acceptance_for.get(method)
    return twin.eval()


def new_drafter(kind: str, target_config, seed: int = 0, **overrides) -> Drafter:
    """A freshly initialised drafter shaped for `target_config` (a transformers config)."""
    torch.manual_seed(seed)
    drafter = Drafter.from_config(DrafterConfig.for_target(weights_kind(kind), target_config, **overrides))
    return for_method(drafter, kind)
