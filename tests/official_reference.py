"""The official Gumiho and EAGLE drafter modules (../shared/reference), for tests that compare against them.

A plain clone of the project has no ../shared: `official_modules()` then skips the calling test. The official
code imports `loguru` and `addict`, which the project does not install: stand-ins are put in `sys.modules` only
while it is imported. The modules are imported under their own package names so that the reference's `gumiho`
package does not shadow ours. Nothing here is copied from that code; it is only imported and called.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import sys
import types
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from gumiho.target import Target

REFERENCE = Path(__file__).resolve().parents[2] / "shared" / "reference"
PACKAGES = {"official_gumiho_model": REFERENCE / "gumiho" / "gumiho" / "model",
            "official_eagle_model": REFERENCE / "eagle" / "eagle" / "model"}


@dataclass
class Official:
    gumiho: types.ModuleType  # gumiho/model/cnets.py
    eagle: types.ModuleType  # eagle/model/cnets1.py
    EConfig: type


def official_modules() -> Official:
    if not all(folder.is_dir() for folder in PACKAGES.values()):
        pytest.skip(f"the official reference code is not here ({REFERENCE}); these tests compare against it")
    stubs = {}
    for name, attrs in (("loguru", {"logger": logging.getLogger("official")}), ("addict", {"Dict": dict})):
        if importlib.util.find_spec(name) is None and name not in sys.modules:
            stubs[name] = sys.modules[name] = types.SimpleNamespace(**attrs)
    try:
        for alias, folder in PACKAGES.items():
            if alias not in sys.modules:
                spec = importlib.util.spec_from_file_location(alias, folder / "__init__.py",
                                                              submodule_search_locations=[str(folder)])
                sys.modules[alias] = module = importlib.util.module_from_spec(spec)
                spec.loader.exec_module(module)
        gumiho = importlib.import_module("official_gumiho_model.cnets")
        eagle = importlib.import_module("official_eagle_model.cnets1")
    finally:
        for name in stubs:
            sys.modules.pop(name)
    return Official(gumiho, eagle, importlib.import_module("official_gumiho_model.configs").EConfig)


def econfig(official: Official, target: Target, layers: int):
    """The official EConfig for a drafter of `target` (what gumiho/train/*.json and EAGLE's config.json hold)."""
    c = target.model.config
    config = official.EConfig(
        vocab_size=c.vocab_size, hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
        num_hidden_layers=layers, num_attention_heads=c.num_attention_heads,
        num_key_value_heads=c.num_key_value_heads, max_position_embeddings=c.max_position_embeddings,
        rms_norm_eps=c.rms_norm_eps, rope_theta=10000.0,
    )
    config.rope_scaling = None  # transformers 5 fills it in; the official rotary code reads rope_scaling["type"]
    return config


def gumiho_args(top_k: int = 4, depth: int = 6, total_tokens: int = 20, mlptopk: int = 3, pruning: int = 5):
    """The official command-line settings (scripts/eval_llama3.sh), FTA (complete_mask) off."""
    return types.SimpleNamespace(serial_head_num=2, mlp_num=depth - 1, top_k=top_k, depth=depth,
                                 total_tokens=total_tokens, mlptopk=mlptopk, pruning=pruning, complete_mask=0)


def randomize(module: torch.nn.Module, embed_weight: torch.Tensor, seed: int) -> None:
    """Every weight random (the MLP heads start at zero), the embedding the target's frozen copy. Matrices get
    std 1/sqrt(fan_in) so that draft distributions stay far from one-hot (exact score ties would make the trees'
    tie-breaking, not the drafters, decide)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            noise = torch.randn(p.shape, generator=generator)
            if name == "embed_tokens.weight":
                p.copy_(embed_weight)
            elif p.dim() == 2:
                p.copy_(noise / p.shape[1] ** 0.5)
            else:
                p.copy_((1.0 if name.endswith("layernorm.weight") else 0.0) + 0.1 * noise)


def checkpoint_state(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The module's state dict as the checkpoints store it (gumiho_model.py maps `mlp.` to `mlp.mlp.` on load)."""
    return {k.replace("mlp.mlp.", "mlp.", 1) if k.startswith("mlp.mlp.") else k: v.clone()
            for k, v in module.state_dict().items()}


def load_checkpoint_state(module: torch.nn.Module, state: dict[str, torch.Tensor]) -> None:
    """What the official loaders do with a checkpoint's state dict (Gumiho's remap; strict)."""
    module.load_state_dict({("mlp." + k) if k.startswith("mlp.") else k: v for k, v in state.items()}, strict=True)
