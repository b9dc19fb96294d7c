"""Build an Engine from user-facing names: a model (default, folder or Hub id) and drafter folders."""

from __future__ import annotations

import logging
from pathlib import Path

from .drafters import new_drafter
from .drafters.checkpoint import load_drafter
from .engine import Engine
from .target import DEFAULT_MODEL, load_target

log = logging.getLogger(__name__)

ASSETS = Path(__file__).resolve().parent.parent / "assets"
SHIPPED = {DEFAULT_MODEL: {m: ASSETS / "drafters" / f"smollm2-135m-{m}" for m in ("eagle2", "gumiho")}}


def shipped_drafter(model: str | None, method: str) -> Path | None:
    path = SHIPPED.get(model or DEFAULT_MODEL, {}).get(method)
    return path if path is not None and (path / "model.safetensors").is_file() else None


def build_engine(
    model: str | None = None,
    drafters: dict[str, str | None] | None = None,
    device: str | None = None,
    threads: int | None = None,
    seed: int = 0,
) -> Engine:
    """`drafters` maps a method to a drafter folder or Hub id (ours or an official checkpoint), or None for the
    shipped one (random weights if none ships)."""
    target = load_target(model, device=device, threads=threads)
    engine = Engine(target)
    for method, folder in ({"eagle2": None, "gumiho": None} if drafters is None else drafters).items():
        path = folder or shipped_drafter(model, method)
        if path is not None:  # our folder format or an official checkpoint, local or a Hub id
            drafter = load_drafter(str(path), method, target.embed_weight, target.model.config)
            name = str(path)
        else:
            log.warning("no trained %s drafter for %s: using random weights (exact, but nothing gets accepted)",
                        method, target.name)
            drafter, name = new_drafter(method, target.model.config, seed=seed), f"random-{method}"
        engine.add_drafter(method, drafter, name)
    return engine
