"""Build an Engine from user-facing names: a model (default, folder or Hub id) and drafter folders."""

from __future__ import annotations

import logging
from pathlib import Path

from typing import Callable

from .choice import Choice, Unmeasured, choose
from .drafters import DRAFTERS, WEIGHT_FREE, Drafter, new_drafter, weight_free, weights_kind
from .drafters.checkpoint import load_drafter
from .drafters.frequency import FREQUENT_DRAFT_VOCAB
from .engine import Engine
from .errors import GumihoError
from .profile import ExecPath, MachineProfile, bf16_units, cached_profile, complete, load_or_measure, target_for
from .trace import DRAFTED_METHODS
from .target import DEFAULT_MODEL, Target, load_target, parse_dtype, pick_device

log = logging.getLogger(__name__)

ASSETS = Path(__file__).resolve().parent.parent / "assets"
SHIPPED = {DEFAULT_MODEL: {m: ASSETS / "drafters" / f"smollm2-135m-{m}" for m in DRAFTERS}}


def shipped_drafter(model: str | None, method: str) -> Path | None:
    path = SHIPPED.get(model or DEFAULT_MODEL, {}).get(weights_kind(method))
    return path if path is not None and (path / "model.safetensors").is_file() else None


def default_drafters(model: str | None, folders: dict[str, str | None] | None = None) -> dict[str, str | None]:
    """Every method that can draft for the model: EAGLE-2 and Gumiho always (random when none ship), the methods
    without weights (lookup, recycle) always, the others when their weights ship for the model or are given.
    `folders` maps a weights kind to a folder (EAGLE-1 and MJSD draft with the EAGLE-2 folder)."""
    folders = folders or {}
    return {m: folders.get(weights_kind(m)) for m in DRAFTED_METHODS
            if m in ("eagle2", "gumiho", *WEIGHT_FREE) or folders.get(weights_kind(m)) or shipped_drafter(model, m)}


def load_drafters(target: Target, model: str | None, drafters: dict[str, str | None] | None,
                  seed: int = 0) -> dict[str, tuple[Drafter, str]]:
    """method -> (drafter, name). `drafters` maps a method to a folder or Hub id (ours or an official checkpoint),
    or None for the shipped one (random weights when none ships); the methods without weights take None (their
    name is ""). The default: `default_drafters`."""
    out = {}
    for method, folder in (default_drafters(model) if drafters is None else drafters).items():
        if method not in DRAFTED_METHODS:
            raise GumihoError(f"{method} is not a drafted method; choose from {', '.join(DRAFTED_METHODS)}")
        if method in WEIGHT_FREE:
            if folder is not None:
                raise GumihoError(f"{method} drafts without weights: it takes no drafter folder (got {folder})")
            out[method] = weight_free(method, target.model.config), ""
            continue
        path = folder or shipped_drafter(model, method)
        if path is not None:  # our folder format or an official checkpoint, local or a Hub id
            drafter = load_drafter(str(path), method, target.embed_weight, target.model.config)
            # As Target.prepare_drafter will: before the machine profile, whose draft timings are keyed by its size
            drafter.keep_frequent(FREQUENT_DRAFT_VOCAB, target.eos_ids)
            out[method] = drafter, str(path)
        else:
            log.warning("no trained %s drafter for %s: using random weights (exact, but nothing gets accepted)",
                        method, target.name)
            out[method] = new_drafter(method, target.model.config, seed=seed), f"random-{method}"
    return out


def build_engine(
    model: str | None = None,
    drafters: dict[str, str | None] | None = None,
    device: str | None = None,
    threads: int | None = None,
    seed: int = 0,
    dtype: str | None = "auto",
    trees: str = "auto",
    lead: str = "gumiho",
    progress: bool = False,
    on_progress: Callable[[float], None] | None = None,
) -> Engine:
    """Load the target and its drafters and make the automatic choices.

    dtype "auto": the execution path (dtype, forward, packing) that the machine profile expects to make `lead`
    fastest; a dtype name fixes the dtype (the profile still picks forward and packing). trees "auto": each
    method's tree from the profile and the drafter's acceptance statistics; "default": the fixed per-device
    defaults, and no profile is measured unless the dtype is auto.
    """
    wanted = parse_dtype(dtype)
    device_ = pick_device(device)
    if wanted == "bfloat16" and device_.type == "cpu" and not bf16_units(device_):
        log.warning("this CPU has no bf16 units: a bfloat16 step is fast, but a bfloat16 tree verification costs "
                    "several steps")
    target = load_target(model, device=device, threads=threads)
    loaded = load_drafters(target, model, drafters, seed)
    choice = None
    if wanted is None or trees == "auto":
        drafters_ = {m: d for m, (d, _) in loaded.items()}
        profile = load_or_measure(target, drafters_, progress, on_progress)
        try:
            choice = choose_measured(target, drafters_, profile, lead, wanted, trees == "auto", progress, on_progress)
        except GumihoError:  # an explicit dtype the profile did not measure (int4 where torch has no kernel)
            log.warning("no measurement of %s on this machine: default trees", wanted)
    if choice is not None:
        path = choice.path
    else:
        path = ExecPath(wanted or str(target.dtype).removeprefix("torch."), pack=(wanted or "float32") == "float32")
    target = target_for(target, path)
    engine = Engine(target)
    for method, (drafter, name) in loaded.items():
        engine.add_drafter(method, drafter, name)
    engine.choice = choice
    return engine


def choose_trees(engine: Engine, lead: str = "gumiho", measure: bool = True,
                 on_progress: Callable[[float], None] | None = None) -> bool:
    """The automatic trees for an engine built on a fixed path with trees="default" (a ZeroGPU Space loads its
    model before a GPU is attached and measures once one is): from the cached profile, else (`measure`) from a new
    measurement. Returns whether a choice was made."""
    target, drafters = engine.target, dict(engine.drafters)
    profile = (load_or_measure(target, drafters, False, on_progress) if measure
               else cached_profile(target, drafters))
    if profile is None:
        return False
    try:
        engine.choice = choose_measured(target, drafters, profile, lead, target.precision, auto_trees=True,
                                        on_progress=on_progress, measure=measure)
    except Unmeasured:  # the engine's path was screened, and measuring it was not asked for
        return False
    return True


def choose_measured(target: Target, drafters: dict[str, Drafter], profile: MachineProfile, lead: str,
                    dtype: str | None, auto_trees: bool, progress: bool = False,
                    on_progress: Callable[[float], None] | None = None, measure: bool = True) -> Choice:
    """`choose` for `lead` (AR where it is not among the drafters' methods), timing in full first any screened path
    that the choice asked for needs (`profile.complete`; where `measure` is False, `Unmeasured` is raised instead)."""
    methods = ["ar", *drafters]
    acceptance = {m: d.acceptance for m, d in drafters.items()}
    options = dict(methods=methods, lead=lead if lead in methods else "ar", acceptance=acceptance,
                   device_type=target.device.type, dtype=dtype, auto_trees=auto_trees, units=bf16_units(target.device))
    try:
        return choose(profile, **options)
    except Unmeasured as missing:
        if not measure:
            raise
        return choose(complete(target, drafters, profile, missing.paths, progress, on_progress), **options)
