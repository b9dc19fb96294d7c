"""The machine profile: what each way of running the target and the drafters costs on the machine at hand.

Processors differ (AVX2 only; AVX-512 with bf16 dot products; AMX tiles; GPUs), and a tuning measured on one can
be wrong on another: oneDNN-packed fp32 matmuls help one CPU and hurt the next, bf16 is 3x faster than fp32 on a
CPU with bf16 units and 5x slower on one without. So the engine measures, once per (machine, model, drafter
shapes), for each candidate execution path (dtype, forward, packing):

  verify_ms   one target forward over n tree tokens (tree mask) + the lm_head + argmax, for n in SIZES, on top of
              a KV cache of each length in KV_LENGTHS (lower quartile of a few interleaved repeats);
  draft_ms    one `propose` call of each drafter for each candidate top_k, after a realistic prefix.

The profile is cached in `$GUMIHO_CACHE/profiles/` under the machine's signature (processor and its features,
device, threads, torch version); a new processor, or a file that does not parse as a profile, is measured again.
`choice.py` turns a profile and the drafters' acceptance statistics into the automatic settings.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import os
import platform
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Callable

import torch
from tqdm import tqdm

from .drafters import Drafter
from .packed import pack_linears, packing_enabled
from .target import Target, cache_root
from .tree import TreeSettings

log = logging.getLogger(__name__)

VERSION = 1
SIZES = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64)
KV_LENGTHS = (256, 1024)
TOP_KS = (3, 4, 6, 8)
REPEATS = 3
CPU_FEATURES = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", "avx_vnni")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
SHORT = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


class ProfileError(ValueError):
    """A profile file that is not one this version wrote for this machine."""


# --- the machine -----------------------------------------------------------------------------------------------------
def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_features() -> list[str]:
    """The instruction-set features that matter for matmul speed, as /proc/cpuinfo names them (Linux x86)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                return [f for f in CPU_FEATURES if f in flags]
    except OSError:
        pass
    return []


def bf16_units(device: torch.device) -> str:
    """The hardware that runs bf16 matmuls natively ('' when there is none): 'AMX', 'AVX512-BF16' or the GPU."""
    if device.type == "cuda":
        return "GPU" if torch.cuda.is_bf16_supported() else ""
    if device.type == "mps":
        return ""
    features = cpu_features()
    if "amx_bf16" in features:
        return "AMX"
    if "avx512_bf16" in features:
        return "AVX512-BF16"
    return ""


def signature(device: torch.device) -> dict:
    """What identifies the machine for the profile cache: a change here means measuring again."""
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_name()
    return {"device": device.type, "name": name, "features": cpu_features(), "cores": os.cpu_count() or 0,
            "threads": torch.get_num_threads(), "torch": torch.__version__, "oneDNN": packing_enabled()}


# --- execution paths -------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ExecPath:
    """One way to run the target (and the drafters, which follow its dtype)."""

    dtype: str  # a key of DTYPES
    forward: str = "lean"  # "lean" | "transformers"
    pack: bool = False  # oneDNN-packed fp32 matmuls (CPU only)

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    @property
    def label(self) -> str:
        return f"{SHORT[self.dtype]} {self.forward}" + (" packed" if self.pack else "")


def candidate_paths(device: torch.device) -> list[ExecPath]:
    """What is worth measuring on this device. bf16 on a CPU without bf16 units is left out: it is slower than
    fp32 by a wide margin (software conversion), so measuring it would only spend the time budget."""
    if device.type == "cuda":
        half = [ExecPath("bfloat16")] if torch.cuda.is_bf16_supported() else []
        return half + [ExecPath("float16"), ExecPath("float16", "transformers")]
    if device.type == "mps":
        return [ExecPath("float32"), ExecPath("float16")]
    paths = [ExecPath("float32", "transformers"), ExecPath("float32")]
    if packing_enabled():
        paths.append(ExecPath("float32", pack=True))
    if bf16_units(device):
        paths.append(ExecPath("bfloat16"))
    return paths


def target_for(base: Target, path: ExecPath) -> Target:
    """`base` run the way `path` says. The fp32 model object is shared where the dtype matches (the lean forward
    only re-views its weights); another dtype gets a converted copy."""
    model = base.model
    if path.torch_dtype != base.dtype:
        model = copy.deepcopy(base.model).to(path.torch_dtype)
    return Target(model=model, tokenizer=base.tokenizer, name=base.name, device=base.device, dtype=path.torch_dtype,
                  eos_ids=base.eos_ids, forward=path.forward, pack=path.pack)


def drafter_for(drafter: Drafter, target: Target, pack: bool) -> Drafter:
    """A copy of `drafter` attached to `target` (its dtype), packed or not."""
    copy_ = copy.deepcopy(drafter)
    copy_.attach(target.embed_weight, target.head_weight, pack=pack)
    if pack:
        pack_linears(copy_)
    return copy_.eval()


# --- the profile -----------------------------------------------------------------------------------------------------
@dataclass
class PathCost:
    path: ExecPath
    verify_ms: dict[int, list[float]]  # KV length -> ms per size in SIZES order
    draft_ms: dict[str, dict[int, float]] = field(default_factory=dict)  # method -> top_k -> ms per propose

    def verify_at(self, n: int, kv: int = 512) -> float:
        """T(n) at a KV length `kv`, linear in both n and kv between the measured points (clamped at the ends)."""
        lengths = sorted(self.verify_ms)
        per_length = [_interpolate(SIZES, self.verify_ms[length], n) for length in lengths]
        return _interpolate(lengths, per_length, kv)


def _interpolate(xs, ys, x: float) -> float:
    pairs = list(zip(xs, ys))
    if x <= pairs[0][0]:
        return pairs[0][1]
    for (x0, y0), (x1, y1) in zip(pairs, pairs[1:]):
        if x <= x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return pairs[-1][1]


@dataclass
class MachineProfile:
    signature: dict
    model: str
    drafters: dict[str, str]  # method -> shape key of the drafter that was timed
    costs: list[PathCost]
    seconds: float
    version: int = VERSION

    def cost(self, path: ExecPath) -> PathCost | None:
        return next((c for c in self.costs if c.path == path), None)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: object) -> MachineProfile:
        """Parse and check a stored profile; anything unexpected raises ProfileError (the caller measures again)."""
        try:
            if not isinstance(data, dict) or data.get("version") != VERSION:
                raise ProfileError("not a profile of this version")
            costs = []
            for c in data["costs"]:
                verify = {int(k): [float(x) for x in v] for k, v in c["verify_ms"].items()}
                if sorted(verify) != sorted(KV_LENGTHS) or any(len(v) != len(SIZES) for v in verify.values()):
                    raise ProfileError("a cost curve of another shape")
                draft = {str(m): {int(k): float(v) for k, v in per.items()} for m, per in c["draft_ms"].items()}
                path = ExecPath(**c["path"])
                path.torch_dtype  # noqa: B018 (raises KeyError for an unknown dtype)
                costs.append(PathCost(path, verify, draft))
            if not costs or not all(x > 0 for c in costs for v in c.verify_ms.values() for x in v):
                raise ProfileError("empty or non-positive timings")
            return cls(signature=dict(data["signature"]), model=str(data["model"]), drafters=dict(data["drafters"]),
                       costs=costs, seconds=float(data["seconds"]))
        except ProfileError:
            raise
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ProfileError(f"malformed profile ({type(exc).__name__})") from exc


def drafter_key(drafter: Drafter) -> str:
    """The drafter's shape (what its cost depends on), not its weights: retraining does not invalidate a profile."""
    c = drafter.config
    return f"{c.kind}:h{c.hidden_size}:l{c.num_layers}:v{c.draft_vocab_size or c.vocab_size}:m{c.mlp_heads}"


def profile_key(target: Target, drafters: dict[str, Drafter]) -> str:
    identity = {"signature": signature(target.device), "model": target.name,
                "config": target.model.config.to_json_string(use_diff=False),
                "drafters": {m: drafter_key(d) for m, d in sorted(drafters.items())}}
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:20]


def profile_path(target: Target) -> Path:
    slug = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in target.name)[-80:]
    return cache_root() / "profiles" / f"{slug}.json"


@torch.inference_mode()
def _time_verify(target: Target, kv: int, sizes: tuple[int, ...], repeats: int, tick: Callable[[], None]) -> list[float]:
    generator = torch.Generator().manual_seed(0)
    vocab, device = target.vocab_size, target.device
    cache = target.new_cache()
    target.features(torch.randint(vocab, (kv,), generator=generator).to(device), cache)
    times: dict[int, list[float]] = {n: [] for n in sizes}
    for r in range(repeats + 1):  # repeat 0 warms up
        for n in sizes:
            tokens = torch.randint(vocab, (n,), generator=generator).to(device)
            mask = None
            if n > 1:
                chain = torch.ones(n, n, dtype=torch.bool).tril()
                mask = torch.cat([torch.ones(n, kv, dtype=torch.bool), chain], 1)[None, None].to(device)
            positions = torch.arange(kv, kv + n, device=device)
            _sync(device)
            start = time.perf_counter()
            target.logits(target.features(tokens, cache, positions, mask)).argmax(-1).tolist()
            _sync(device)
            if r:
                times[n].append((time.perf_counter() - start) * 1e3)
            cache.crop(-n)
            tick()
    return [low(times[n]) for n in sizes]


@torch.inference_mode()
def _time_draft(target: Target, drafter: Drafter, method: str, top_ks: tuple[int, ...], repeats: int,
                tick: Callable[[], None]) -> dict[int, float]:
    """ms per `propose` after a 256-token prefix, three newly accepted tokens each time (a typical cycle)."""
    generator = torch.Generator().manual_seed(1)
    device = target.device
    ids = torch.randint(target.vocab_size, (260,), generator=generator).to(device)
    features = target.features(ids, target.new_cache())
    base = TreeSettings.default(method, device.type)
    out = {}
    for k in top_ks:
        tree = widest_tree(method, base, k)
        drafter.reset()
        drafter.propose(features[:256], ids[1:257], tree)
        times = []
        for r in range(repeats + 1):
            drafter.cache.truncate(256)
            _sync(device)
            start = time.perf_counter()
            drafter.propose(features[256:259], ids[257:260], tree)
            _sync(device)
            if r:
                times.append((time.perf_counter() - start) * 1e3)
            tick()
        out[k] = low(times)
    return out


def widest_tree(method: str, base: TreeSettings, top_k: int) -> TreeSettings:
    """`base` with another top_k (Gumiho's per-head candidates and pruning never below it), verifying everything
    it drafts up to the largest profiled size."""
    shape = replace(base, top_k=top_k, total_tokens=1)
    if method == "gumiho":
        shape = replace(shape, mlptopk=max(base.mlptopk, top_k), pruning=max(base.pruning, top_k))
    return replace(shape, total_tokens=min(max(SIZES), shape.pool_size(method) + 1))


def low(values: list[float]) -> float:
    """The lower quartile: other jobs on a shared machine only ever add time."""
    return sorted(values)[len(values) // 4]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(target: Target, drafters: dict[str, Drafter], paths: list[ExecPath] | None = None,
            repeats: int = REPEATS, top_ks: tuple[int, ...] = TOP_KS, progress: bool = True,
            on_progress: Callable[[float], None] | None = None) -> MachineProfile:
    """Time every candidate path. `target` is the fp32 (CPU) or half-precision (GPU) target as loaded."""
    paths = paths or candidate_paths(target.device)
    steps = len(paths) * ((repeats + 1) * len(SIZES) * len(KV_LENGTHS) + len(drafters) * len(top_ks) * (repeats + 1))
    bar = tqdm(total=steps, desc="machine profile", disable=not progress, leave=False)
    done = 0

    def tick() -> None:
        nonlocal done
        done += 1
        bar.update()
        if on_progress:
            on_progress(done / steps)

    start = time.perf_counter()
    costs = []
    for path in paths:
        runner = target_for(target, path)
        verify = {kv: _time_verify(runner, kv, SIZES, repeats, tick) for kv in KV_LENGTHS}
        draft = {m: _time_draft(runner, drafter_for(d, runner, path.pack), m, top_ks, repeats, tick)
                 for m, d in sorted(drafters.items())}
        costs.append(PathCost(path, verify, draft))
        del runner
    bar.close()
    return MachineProfile(signature=signature(target.device), model=target.name,
                          drafters={m: drafter_key(d) for m, d in drafters.items()}, costs=costs,
                          seconds=round(time.perf_counter() - start, 1))


def load_or_measure(target: Target, drafters: dict[str, Drafter], progress: bool = True,
                    on_progress: Callable[[float], None] | None = None) -> MachineProfile:
    """The cached profile for this machine, model and drafter shapes, or a new measurement (then cached)."""
    path, key = profile_path(target), profile_key(target, drafters)
    store: dict = {}
    try:
        store = json.loads(path.read_text())
        if not isinstance(store, dict):
            store = {}
        if key in store:
            profile = MachineProfile.from_dict(store[key])
            if profile.signature == signature(target.device):
                return profile
            log.info("the profile in %s was measured on another machine: measuring again", path)
    except FileNotFoundError:
        pass
    except (OSError, json.JSONDecodeError, ProfileError) as exc:
        log.warning("ignoring the unreadable machine profile %s (%s): measuring again", path, exc)
        store = {}
    log.info("measuring this machine (once; cached in %s)", path)
    profile = measure(target, drafters, progress=progress, on_progress=on_progress)
    store[key] = profile.to_dict()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(store, indent=1))
    tmp.replace(path)
    return profile
