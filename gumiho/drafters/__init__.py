"""Pluggable drafters. Each one turns accepted (feature, token) pairs into a scored candidate pool."""

from __future__ import annotations

from dataclasses import replace

import torch

from ..errors import GumihoError
from ..trace import WEIGHT_FREE_METHODS
from .base import Drafter, FeatureDrafter, HeadDrafter, WeightFreeDrafter
from .config import DrafterConfig
from .eagle1 import Eagle1Drafter
from .eagle2 import Eagle2Drafter
from .gumiho import GumihoDrafter
from .hydra import HydraDrafter
from .lookup import LookupDrafter
from .medusa import MedusaDrafter
from .mjsd import MjsdDrafter
from .recycle import RecycleDrafter

DRAFTERS: dict[str, type[Drafter]] = {"medusa": MedusaDrafter, "hydra": HydraDrafter, "eagle2": Eagle2Drafter,
                                      "gumiho": GumihoDrafter}
# Methods that draft with another method's trained network: method -> (its drafter class, the weights' kind).
BORROWED: dict[str, type[Drafter]] = {"eagle1": Eagle1Drafter, "mjsd": MjsdDrafter}
# Methods that draft without trained weights (docs/design.md §17): available for any model, no folder to load.
WEIGHT_FREE: dict[str, type[WeightFreeDrafter]] = {"lookup": LookupDrafter, "recycle": RecycleDrafter}
assert tuple(WEIGHT_FREE) == WEIGHT_FREE_METHODS

__all__ = ["BORROWED", "DRAFTERS", "WEIGHT_FREE", "Drafter", "DrafterConfig", "Eagle1Drafter", "Eagle2Drafter",
           "FeatureDrafter", "GumihoDrafter", "HeadDrafter", "HydraDrafter", "LookupDrafter", "MedusaDrafter",
           "MjsdDrafter", "RecycleDrafter", "WeightFreeDrafter", "for_method", "new_drafter", "weight_free",
           "weights_kind"]


def weights_kind(method: str) -> str:
    """The kind of drafter folder `method` loads (EAGLE-1 and MJSD draft with EAGLE-2's network)."""
    return BORROWED[method].weights if method in BORROWED else method


def for_method(drafter: Drafter, method: str) -> Drafter:
    """`drafter` as the drafter of `method`: itself, or its weights (and vocabulary counts) in the method's class
    (EAGLE-1 from an EAGLE-2 drafter), with the method's own acceptance statistics."""
    if method not in BORROWED or drafter.kind == method:
        return drafter
    cls = BORROWED[method]
    if drafter.kind != cls.weights:
        raise GumihoError(f"{method} drafts with a {cls.weights} drafter's weights, not a {drafter.kind} drafter's")
    config = replace(drafter.config, kind=method)
    twin = cls(config)
    twin.load_state_dict(drafter.state_dict())
    twin.vocab_counts = drafter.vocab_counts
    twin.acceptance = drafter.acceptance_for.get(method)
    return twin.eval()


def weight_free(method: str, target_config) -> WeightFreeDrafter:
    """The drafter of a method without weights (`WEIGHT_FREE`), shaped for `target_config` (a transformers config)."""
    if method not in WEIGHT_FREE:
        raise GumihoError(f"{method} is not a weight-free method; those are {', '.join(WEIGHT_FREE)}")
    return WEIGHT_FREE[method](DrafterConfig.for_target(method, target_config)).eval()


def new_drafter(kind: str, target_config, seed: int = 0, **overrides) -> Drafter:
    """A freshly initialised drafter shaped for `target_config` (a transformers config)."""
    torch.manual_seed(seed)
    drafter = Drafter.from_config(DrafterConfig.for_target(weights_kind(kind), target_config, **overrides))
    return for_method(drafter, kind)
