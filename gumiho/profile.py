"""The machine profile: what each way of running the target and the drafters costs on the machine at hand.

Processors differ (AVX2 only; AVX-512 with bf16 dot products; AMX tiles; GPUs), and a tuning measured on one can
be wrong on another: oneDNN-packed fp32 matmuls help one CPU and hurt the next; on a CPU without bf16 units a
one-row bf16 product beats fp32 (half the bytes) while a 12-row one is several times slower; 4-bit weights
(int4.py) cost a third of fp32 for one row and little more for three. So the engine assumes nothing and measures,
once per (machine, model, drafter shapes), every candidate execution path (dtype or int4 weights, forward,
packing):

  verify_ms   one target forward over n tree tokens (tree mask) + one lm_head row + argmax, for n in SIZES, on
              top of a KV cache of each length in KV_LENGTHS (lower quartile of a few interleaved repeats);
  head_ms     one more lm_head row (a greedy verification reads one per accepted token: verify.LazyLogits), or
              what a row adds to a product where the head computes rows together (8-bit blocks; the mean over a
              product of PREFETCH_ROWS rows);
  head_alone_ms  one lm_head row in a product of its own: where the head computes rows together, the walk
              prefetches the draft's likeliest path, and an accepted node off it costs this much;
  draft_ms    one `propose` call of each drafter for each candidate top_k, after a realistic prefix and a
              target forward (as in a cycle, the draft finds its weights where a verification left them);
  small_draft_ms  the same for the sizes too small to keep a drafter's deeper nodes (a dynamic drafter stops
              there, `TreeSettings.drafted_depth`; a static tree's layout is shallower), for each such size.

The profile is cached in `$GUMIHO_CACHE/profiles/` under the machine's signature (processor and its features,
device, threads, torch version, the kernels' sources); a new processor, a changed kernel, or a file that does not
parse as a profile, is measured again.
`choice.py` turns a profile and the drafters' acceptance statistics into the automatic settings.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import os
import platform
import statistics
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Callable

import torch
from tqdm import tqdm

from .drafters import Drafter
from .errors import GumihoError
from . import kernels
from .int4 import int4_available
from .packed import packing_enabled, packs
from .prompts import GENERIC_PROMPTS, read_prompts
from .static_tree import STATIC_METHODS, layout
from .target import Target, cache_root
from .tree import TreeSettings, build_tree
from .verify import PREFETCH_ROWS

log = logging.getLogger(__name__)

VERSION = 27  # 3: every dtype and int4 weights measured on a CPU; 4: one lm_head row per verification, head_ms;
# 5: top_k 1 and 2, size 3 and 6, small trees' drafts; 6: the int4 path's 8-bit lm_head;
# 7: 8-bit activations at the int4 path's 4-bit products (kernels/q4_matmul.cpp); 8: draft layers run as a
# llama.DecoderStack, a layer's attention and per-row operations one call each (kernels/attention.cpp, rows.cpp);
# 9: the attention of long caches split across threads; 10: 4-bit products 8 rows per pass; 11: measured with the
# drafter campaign paused (a profile measured under its load put T(1) at 7.4 ms for 5.2 on the 2-core Zen 4 EPYC);
# 12: the 8-bit lm_head rounds its input to 8 bits (integer dot products); 13: draft heads' top-k in one kernel call;
# 14: 512-bit 4-bit products and 8-bit head where AVX-512 runs VNNI; the prefill file names the attention dtype;
# 15: the int4 path's KV cache in fp16; 16: drafts timed after a target forward, the head's rows alone and together;
# 17: 512-bit attention where AVX-512 runs VNNI (the extra rows of a tree over 1,024 cached tokens 23-33% cheaper);
# 18: static trees' small drafts timed (EAGLE's 2-token tree was costed as its 60-token tree's draft);
# 19: the 4-bit and 8-bit products ask for their weights 8 KB ahead (a step 20-25% cheaper on the Zen 5 EPYC);
# 20: T(n) from differences to the T(1) timed just before it (paired_curve): T(2) had come out level with T(1);
# 21: a prompt's fp32 causal attention in blocks (kernels/prompt_attention.cpp), what the prefill's attention
# dtype is measured against; the products ask for their weights non-temporally (a cycle's drafts 5-15% cheaper);
# paths timed one after another (amid each other's repeats the int4 curve came out flat); 22: how far ahead the 4-bit
# and 8-bit products ask for their weights measured per machine (int4.fastest_ahead), kept with the prefill choice;
# 23: the fastest path's greedy replies to calibration prompts (`texts`, for the expected speed-ups: expected.py);
# 24: head_ms where the head computes rows together is a row's share of a PREFETCH_ROWS-row product's increment (a
# second row was free and put head_ms at 0, a third and fourth add 0.06-0.12 ms each on the 2-core Zen 5 EPYC), the
# median of HEAD_PAIRS paired differences; 25: the products may keep their weights in the caches (int4.KEEP: on the
# 2-core Intel Xeon with a 320 MB L3, a decode step's 4-bit products 6.5 -> 3.0 ms), measured at each load; 26: a path
# whose one-token step shows it cannot be the fastest is screened, not timed in full (`measure`); 27: a prompt's bf16
# causal attention through SDPA is a candidate beside the block kernel's (oneDNN's AMX products: on the 2-core Intel
# Xeon with AMX, 30 layers at 763 tokens 83 ms against the kernel's 114 in fp32)
SIZES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
KV_LENGTHS = (256, 1024)
TOP_KS = (1, 2, 3, 4, 6, 8)
DEPTH_CAPPED = ("eagle2", "gumiho")  # drafters that stop at the depth a small tree can keep
SMALL_TOP_K = 4  # the widest first layer whose small trees' drafts are timed (small_sizes)
REPEATS = 3
HEAD_PAIRS = 24  # one-row and PREFETCH_ROWS-row lm_head products timed in turn (each about a millisecond)
TEXT_PROMPTS = 16  # calibration prompts whose greedy replies the profile keeps (`texts`), TEXT_TOKENS tokens each
TEXT_TOKENS = 64
TEXT_PROMPT_TOKENS = 1024  # longer prompts (documents to summarise) are passed over: a slow processor's profile
CALIBRATION_PROMPTS = Path(__file__).resolve().parent.parent / "data" / "calibration" / "prompts.jsonl"
CPU_FEATURES = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", "avx_vnni",
                "avx512_vnni")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
SHORT = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16", "int4": "int4"}
# "int4": 4-bit weights with 8-bit (or bf16: int4.activations) activations at each product; everything else (and the
# drafters) in fp32.
ACTIVATIONS = {**DTYPES, "int4": torch.float32}
STEEP = 8.0  # a size whose verification costs this many one-token steps is measured once, then extrapolated


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
    # torch's CPU capability too: ATEN_CPU_CAPABILITY=avx2 builds the kernels an AVX2-only processor runs; and the
    # kernels' sources, whose speed the profile times.
    return {"device": device.type, "name": name, "features": cpu_features(), "cores": os.cpu_count() or 0,
            "threads": torch.get_num_threads(), "torch": torch.__version__, "oneDNN": packing_enabled(),
            "capability": torch.backends.cpu.get_cpu_capability(), "kernels": kernels.source_digest()}


# --- execution paths -------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ExecPath:
    """One way to run the target (and the drafters, which follow its dtype)."""

    dtype: str  # a key of ACTIVATIONS: a dtype, or "int4" (4-bit weights)
    forward: str = "lean"  # "lean" | "transformers"
    pack: bool = False  # oneDNN-packed matmuls (CPU, fp32 and bf16)

    @property
    def torch_dtype(self) -> torch.dtype:
        """The dtype of the activations and the KV cache (fp32 for int4 weights)."""
        return ACTIVATIONS[self.dtype]

    @property
    def label(self) -> str:
        return f"{SHORT[self.dtype]} {self.forward}" + (" packed" if self.pack else "")


def candidate_paths(device: torch.device, forward: str = "lean") -> list[ExecPath]:
    """What is measured on this device. On a CPU: every dtype (fp32, bf16 and fp16, whether or not the processor
    has half-precision units: one-row half-precision products can win without them), packed where oneDNN packs,
    and int4 weights where a 4-bit kernel runs (ours or torch's) and so does the lean forward. A GPU gets the
    half-precision dtype it was loaded in: a second copy of a GPU-sized model may not fit. The transformers forward is measured only for
    models the lean forward does not run: where both run, the lean one does the same arithmetic with less around
    it (docs/benchmarks.md has the comparison)."""
    if device.type == "cuda":  # one path: a second copy of a GPU-sized model in another dtype may not fit
        return [ExecPath("bfloat16" if torch.cuda.is_bf16_supported() else "float16", forward)]
    if device.type == "mps":  # untested here (no Apple machine)
        return [ExecPath("float32", forward)]
    paths = [ExecPath("float32", forward)]
    if packing_enabled():
        paths.append(ExecPath("float32", forward, pack=True))
    paths.append(ExecPath("bfloat16", forward))
    if packs(torch.bfloat16):
        paths.append(ExecPath("bfloat16", forward, pack=True))
    paths.append(ExecPath("float16", forward))
    if forward == "lean" and int4_available():  # `pack` here: the drafters' fp32 matmuls
        paths.append(ExecPath("int4", forward, pack=packing_enabled()))
    return paths


def target_for(base: Target, path: ExecPath) -> Target:
    """`base` run the way `path` says. The fp32 model object is shared where the dtype matches (the lean forward
    only re-views its weights, int4 reads its own blocks); another dtype gets a converted copy."""
    model = base.model
    if path.torch_dtype != base.dtype:
        model = copy.deepcopy(base.model).to(path.torch_dtype)
    return Target(model=model, tokenizer=base.tokenizer, name=base.name, device=base.device, dtype=path.torch_dtype,
                  eos_ids=base.eos_ids, forward=path.forward, pack=path.pack, int4=path.dtype == "int4")


def drafter_for(drafter: Drafter, target: Target) -> Drafter:
    """A copy of `drafter` made ready for `target`, as an engine on that path would run it."""
    return target.prepare_drafter(copy.deepcopy(drafter))


# --- the profile -----------------------------------------------------------------------------------------------------
@dataclass
class PathCost:
    """What one path costs. Its verification curves never fall with n: a measurement that does (a 2-token forward
    timed below a 1-token one, as a busy moment on a shared machine gives) is replaced by the nondecreasing curve
    nearest to it, so that noise cannot make a larger tree look free, nor a one-token step look dear."""

    path: ExecPath
    verify_ms: dict[int, list[float]]  # KV length -> ms per size in SIZES order (one lm_head row included)
    draft_ms: dict[str, dict[int, float]] = field(default_factory=dict)  # method -> top_k -> ms per propose
    head_ms: float = 0.0  # one more lm_head row: a verification reads one per accepted token (verify.LazyLogits)
    small_draft_ms: dict[str, dict[int, dict[int, float]]] = field(default_factory=dict)  # method -> top_k -> n -> ms
    head_together: bool = False  # the head computes rows together: head_ms is what a row adds to a product
    head_alone_ms: float = 0.0  # one row in a product of its own (head_ms where the head does not batch; 0: head_ms)
    # Timed only as far as showing it cannot be the fastest (`measure`'s screen): each curve is its one-token step at
    # every size (a lower bound, the curves never falling), no draft or head timings. `choice.choose` never picks it,
    # and asks for its full measurement (`complete`) where the bound is not enough to rule it out.
    screened: bool = False

    def __post_init__(self) -> None:
        self.verify_ms = {kv: nondecreasing(curve) for kv, curve in self.verify_ms.items()}
        # n -> T(n) at each measured KV length, shortest first: kept as sizes are asked for (a run's sizer asks for
        # the same few sizes every cycle, each time at a new KV length). Not a field: never stored or compared.
        self._at_n: dict[float, list[float]] = {}

    def draft_at(self, method: str, top_k: int, n: int) -> float:
        """A draft call for a tree of n tokens: cheaper than the full draft when n is too small for its deeper
        nodes (`small_draft_ms`), else `draft_ms`."""
        return self.small_draft_ms.get(method, {}).get(top_k, {}).get(n, self.draft_ms[method][top_k])

    def cycle_ms(self, n: int, together: float, alone: float, kv: int = 512) -> float:
        """A verification of n tokens: T(n), which includes the root's lm_head row, `together` more rows computed in
        the same product (the acceptance walk's prefetch of the draft's likeliest path, where the head computes
        rows together) and `alone` rows (expected) computed one at a time, as the walk reads them."""
        return self.verify_at(n, kv) + together * self.head_ms + alone * (self.head_alone_ms or self.head_ms)

    def tree_cycle_ms(self, n: int, accepted: float, kv: int = 512) -> float:
        """`cycle_ms` for a tree of n tokens from which `accepted` draft tokens are accepted (expected), taken as a
        chain: the walk prefetches min(n, PREFETCH_ROWS) rows where the head computes rows together (verify.py),
        and reads every accepted row past them alone."""
        together = min(n, PREFETCH_ROWS) - 1 if self.head_together else 0
        return self.cycle_ms(n, together, max(0.0, accepted - together), kv)

    def verify_at(self, n: int, kv: int = 512) -> float:
        """T(n) at a KV length `kv`, linear in both n and kv between the measured points (clamped at the ends)."""
        lengths = sorted(self.verify_ms)
        if n not in self._at_n:
            self._at_n[n] = [_interpolate(SIZES, self.verify_ms[length], n) for length in lengths]
        return _interpolate(lengths, self._at_n[n], kv)


def nondecreasing(values: list[float]) -> list[float]:
    """The nondecreasing sequence nearest to `values` in least squares (pool adjacent violators: a run that falls
    is replaced by its mean); a sequence that never falls comes back unchanged."""
    blocks: list[tuple[float, int]] = []  # (sum, count) of each pooled run
    for value in values:
        total, count = float(value), 1
        while blocks and blocks[-1][0] * count > total * blocks[-1][1]:  # the previous run's mean is higher
            previous, n = blocks.pop()
            total, count = total + previous, count + n
        blocks.append((total, count))
    return [total / count for total, count in blocks for _ in range(count)]


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
    seconds: float  # what timing took, the paths timed in full later (`complete`) included
    # The fastest path's greedy replies to calibration prompts, as (prompt length, prompt and reply ids): the text a
    # method's cycles are replayed on to expect what prompt lookup adds (expected.py). Empty: not measured.
    texts: list[tuple[int, list[int]]] = field(default_factory=list)
    version: int = VERSION

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
                small = {str(m): {int(k): {int(n): float(v) for n, v in by_n.items()} for k, by_n in per.items()}
                         for m, per in c["small_draft_ms"].items()}
                path = ExecPath(**c["path"])
                path.torch_dtype  # noqa: B018 (raises KeyError for an unknown dtype)
                costs.append(PathCost(path, verify, draft, float(c["head_ms"]), small, bool(c["head_together"]),
                                      float(c["head_alone_ms"]), bool(c["screened"])))
            if not costs or not all(x > 0 for c in costs for v in c.verify_ms.values() for x in v):
                raise ProfileError("empty or non-positive timings")
            texts = [(int(length), [int(i) for i in ids]) for length, ids in data.get("texts", [])]
            if any(not 0 < length < len(ids) for length, ids in texts):
                raise ProfileError("a text without a prompt or a reply")
            return cls(signature=dict(data["signature"]), model=str(data["model"]), drafters=dict(data["drafters"]),
                       costs=costs, seconds=float(data["seconds"]), texts=texts)
        except ProfileError:
            raise
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ProfileError(f"malformed profile ({type(exc).__name__})") from exc


def drafter_key(drafter: Drafter) -> str:
    """The drafter's shape (what its cost depends on), not its weights: retraining does not invalidate a profile."""
    c = drafter.config
    return f"{c.kind}:h{c.hidden_size}:l{c.num_layers}:v{c.draft_vocab_size or c.vocab_size}:m{c.mlp_heads}"


def profile_key(target: Target) -> str:
    """Machine, model and its architecture; the drafters a profile timed are checked per entry."""
    identity = {"signature": signature(target.device), "model": target.name,
                "config": target.model.config.to_json_string(use_diff=False)}
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:20]


def prefill_path(target: Target) -> Path:
    """Where the int4 path's prefill choice (`llama.LeanLlama._prefill_choice`) is kept: per machine and model, beside
    the profiles, renewed with them (VERSION), so that every process on a machine prefills a prompt alike."""
    return cache_root() / "profiles" / f"prefill-v{VERSION}-{profile_key(target)}.json"


def profile_path(target: Target) -> Path:
    slug = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in target.name)[-80:]
    return cache_root() / "profiles" / f"{slug}.json"


class VerifyTimer:
    """One path's target forwards over a KV cache of `kv` tokens, one size at a time."""

    def __init__(self, target: Target, kv: int):
        self.target, self.kv = target, kv
        self.generator = torch.Generator().manual_seed(kv)
        self.cache = target.new_cache()
        if target.lean is not None:  # what the cache holds does not change a forward's cost: no prefill needed
            self.cache.reserve(kv + max(SIZES))
            for tensor in (self.cache.keys, self.cache.values):
                tensor[..., :kv, :] = torch.randn(tensor[..., :kv, :].shape, generator=self.generator)
            self.cache.length = kv
        else:
            target.features(self._tokens(kv), self.cache)

    def _tokens(self, n: int) -> torch.Tensor:
        return torch.randint(self.target.vocab_size, (n,), generator=self.generator).to(self.target.device)

    @torch.inference_mode()
    def __call__(self, n: int) -> float:
        device, kv = self.target.device, self.kv
        tokens, mask = self._tokens(n), None
        if n > 1:
            chain = torch.ones(n, n, dtype=torch.bool).tril()
            mask = torch.cat([torch.ones(n, kv, dtype=torch.bool), chain], 1)[None, None].to(device)
        positions = torch.arange(kv, kv + n, device=device)
        _sync(device)
        start = time.perf_counter()
        self.target.logits(self.target.features(tokens, self.cache, positions, mask)[:1]).argmax(-1).tolist()
        _sync(device)
        elapsed = (time.perf_counter() - start) * 1e3
        self.cache.crop(-n)
        return elapsed


class DraftTimer:
    """One drafter's draft work in a cycle after a 256-token prefix, three newly accepted tokens each call: what it
    observes of the previous verification (`Drafter.observe`, counted as drafting by the engine too), `propose`
    and the tree build. The last tokens repeat earlier ones, so that lookup finds matches and the recycling table
    has rows to draft from. `before` runs untimed just before: a target forward, as in a cycle, so that the draft
    finds its weights where a verification left them (timed straight after its own set-up, Gumiho's 3-token draft
    took 1.13 ms against 1.28 after a forward, and 1.05 in the engine's cycles, on a 2-core AMD EPYC Zen 5)."""

    def __init__(self, target: Target, drafter: Drafter, method: str, ids: torch.Tensor, features: torch.Tensor,
                 before: Callable[[], object] = lambda: None):
        """`ids` [260] (its last three repeating earlier ones), `features` [260, H]: the target's features for `ids`
        (any path's: the cost does not depend on them)."""
        self.ids, self.features = ids.to(target.device), features.to(target.device, target.dtype)
        self.target, self.drafter, self.method, self.device = target, drafter, method, target.device
        self.before = before

    @torch.inference_mode()
    def __call__(self, top_k: int, total_tokens: int | None = None) -> float:
        """ms of one cycle's draft for the widest tree of `top_k`, or for a tree of `total_tokens` of the family."""
        tree, drafter = widest_tree(self.method, top_k), self.drafter
        if total_tokens:
            tree = replace(tree, total_tokens=total_tokens)
        drafter.reset()
        drafter.observe(self.ids[:256], self.features[:256])
        drafter.propose(self.features[:256], self.ids[1:257], tree)
        verified = slice(256, 256 + min(tree.total_tokens, 4))  # a previous verification's rows, as a chain
        parents = list(range(-1, verified.stop - verified.start - 1))
        logits = self.target.logits(self.features[verified])  # the verification's work, not the draft's
        self.before()
        _sync(self.device)
        start = time.perf_counter()
        drafter.observe(self.ids[verified], self.features[verified], logits, parents)
        pool = drafter.propose(self.features[256:259], self.ids[257:260], tree)
        build_tree(int(self.ids[259]), pool, tree.total_tokens, self.device)
        _sync(self.device)
        return (time.perf_counter() - start) * 1e3


def small_sizes(method: str, top_k: int) -> tuple[int, ...]:
    """The profiled sizes (the choice's candidates) at which `method`'s drafter stops before the widest tree's depth:
    each costs its own draft. A static tree's layout of n tokens is as deep as its first n - 1 paths reach (EAGLE
    drafts, and Medusa and Hydra run heads, that deep only: 2 tokens cost EAGLE's drafter one level, not the
    widest tree's five). A dynamic drafter's only for top_k up to SMALL_TOP_K: a wider first layer never accepts more
    at these sizes (the shipped drafters' statistics: within 0.05 tokens of top_k 4 up to 6 tokens) and costs more,
    so its full draft's cost (an overestimate) leaves the choice unchanged, for a shorter profile."""
    widest = widest_tree(method, top_k)
    if method in STATIC_METHODS:
        full = layout(method, widest.depth, widest.total_tokens - 1).depth
        return tuple(n for n in SIZES if 2 <= n < widest.total_tokens
                     and layout(method, widest.depth, n - 1).depth < full)
    if method not in DEPTH_CAPPED or top_k > SMALL_TOP_K:
        return ()
    return tuple(n for n in SIZES if 2 <= n < widest.total_tokens
                 and replace(widest, total_tokens=n).drafted_depth < widest.depth)


def method_top_ks(method: str, top_ks: tuple[int, ...] = TOP_KS) -> tuple[int, ...]:
    """The top_ks profiled and calibrated for `method`: a static tree has one shape, its own, and so has MJSD's
    chain (its beams are not chosen automatically)."""
    return (TreeSettings.default(method).top_k,) if method in (*STATIC_METHODS, "mjsd") else top_ks


def widest_tree(method: str, top_k: int) -> TreeSettings:
    """The tree family that the profile times, the calibration measures and the choice picks from, the same on
    every device (so a drafter's acceptance statistics apply everywhere): the method's CPU default shape with
    another top_k (Gumiho's per-head candidates and pruning never below it; a static tree keeps its own), FTA and the
    lookup switch and branches off,
    verifying everything it drafts up to the largest profiled size."""
    base = TreeSettings.default(method, "cpu")
    shape = replace(base, top_k=base.top_k if method in STATIC_METHODS else top_k, total_tokens=1, fta=False,
                    lookup_merge=0, lookup_branches=0)
    if method == "gumiho":
        shape = replace(shape, mlptopk=max(base.mlptopk, top_k), pruning=max(base.pruning, top_k))
    return replace(shape, total_tokens=min(max(SIZES), shape.pool_size(method) + 1))


@torch.inference_mode()
def head_row_ms(target: Target, feature: torch.Tensor, pairs: int = HEAD_PAIRS) -> tuple[float, float]:
    """What one more lm_head row costs a verification, and one row in a product of its own: both a one-row
    product, except where the head computes rows together (`Target.head_batches`): there the first is what a row
    adds to a product, on average over the rows a walk prefetches (PREFETCH_ROWS). A one-row and a PREFETCH_ROWS-row
    product are timed in turn, `pairs` times after a warm-up pair: the increment is the median of the pairs'
    differences, the one row the lower quartile of its times (three one-row timings apart from the wider ones put
    the increment at a third of what it is on the 2-core Zen 5 EPYC: 0.03 ms a row against 0.09)."""

    def timed(rows: torch.Tensor) -> float:
        _sync(target.device)
        start = time.perf_counter()
        target.logits(rows).argmax(-1).tolist()
        _sync(target.device)
        return (time.perf_counter() - start) * 1e3

    wide = feature.expand(PREFETCH_ROWS, -1)
    ones, steps = [], []
    for pair in range(pairs + 1):
        one, more = timed(feature), timed(wide) if target.head_batches else 0.0
        if pair:
            ones.append(one)
            steps.append(more - one)
    alone = low(ones)
    if target.head_batches:
        return max(0.0, statistics.median(steps)) / (PREFETCH_ROWS - 1), alone
    return alone, alone


def paired_curve(samples: dict[int, list[float]], warm: dict[int, float]) -> list[float]:
    """T(n) for each of SIZES from a path's timings at one KV length, one per repeat (`warm`: repeat 0's, for a size
    not timed again): T(1) as `low` of its own, and each T(n) as T(1) plus the median, over the repeats, of T(n)
    minus the T(1) timed just before it in the same repeat. Sizes timed apart drift apart: the lowest of each, taken
    separately, once put T(2) level with T(1) on a 2-core Zen 5 EPYC (4.28 ms both), where back to back they are 0.3
    ms apart, and the sizer then verified a second token at 2-15% expected acceptance."""
    ones = samples[SIZES[0]]
    if not ones:
        return [warm[n] for n in SIZES]
    curve = [low(ones)]
    for n in SIZES[1:]:
        times = samples[n]
        curve.append(curve[0] + statistics.median(t - one for t, one in zip(times, ones)) if times else warm[n])
    return curve


def low(values: list[float]) -> float:
    """The lower quartile: other jobs on a shared machine only ever add time."""
    return sorted(values)[len(values) // 4]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class _Progress:
    """The profile's progress bar, and `on_progress` at every tenth of it, over a total that grows as the screen
    sends paths to be timed in full (the tenths reported never go back)."""

    def __init__(self, progress: bool, on_progress: Callable[[float], None] | None):
        self.bar = tqdm(total=0, desc="machine profile", disable=not progress, leave=False)
        self.on_progress, self.done, self.total, self.tenths = on_progress, 0, 0, 0  # (a disabled bar counts nothing)

    def add(self, jobs: int) -> None:
        self.total += jobs
        self.bar.total = self.total
        self.bar.refresh()

    def step(self) -> None:
        self.bar.update()
        self.done += 1
        tenths = self.done * 10 // max(1, self.total)
        if self.on_progress and tenths > self.tenths:
            self.tenths = tenths
            self.on_progress(self.done / self.total)

    def close(self) -> None:
        self.bar.close()


def _draft_inputs(target: Target) -> tuple[torch.Tensor, torch.Tensor]:
    """The ids the draft timers run on (260, the last six repeating earlier ones, so that lookup matches and
    recycling has table rows) and the target's features for them."""
    ids = torch.randint(target.vocab_size, (260,), generator=torch.Generator().manual_seed(1)).to(target.device)
    ids[254:260] = ids[100:106].clone()
    return ids, target.features(ids, target.new_cache())


def _screen(verify: list[list[VerifyTimer]], repeats: int, bar: _Progress) -> list[list[float]]:
    """Each path's one-token step at each KV length: `low` of `repeats` timings after a warm-up one, each after an
    untimed step of the same path (as the previous cycle's), the paths in turn within a repeat."""
    samples: list[list[list[float]]] = [[[] for _ in timers] for timers in verify]
    for r in range(repeats + 1):
        for i, timers in enumerate(verify):
            for j, timer in enumerate(timers):
                timer(1)
                ms = timer(1)
                if r:
                    samples[i][j].append(ms)
                bar.step()
    return [[low(times) for times in per] for per in samples]


def _jobs(drafters: dict[str, Drafter], top_ks: tuple[int, ...]) -> list[tuple[int | str, int | tuple]]:
    """One repeat of a path's full timing: (KV length index, size) for each verification, (method, (top_k, None))
    for each draft, (method, (top_k, n)) for each small tree's draft."""
    jobs: list[tuple[int | str, int | tuple]] = [(j, n) for j in range(len(KV_LENGTHS)) for n in SIZES]
    jobs += [(m, (k, None)) for m in sorted(drafters) for k in method_top_ks(m, top_ks)]
    jobs += [(m, (k, n)) for m in sorted(drafters) for k in method_top_ks(m, top_ks) for n in small_sizes(m, k)]
    return jobs


def _time_paths(paths: list[ExecPath], runners: list[Target], verify: list[list[VerifyTimer]],
                drafters: dict[str, Drafter], inputs: tuple[torch.Tensor, torch.Tensor], which: list[int],
                repeats: int, top_ks: tuple[int, ...], bar: _Progress) -> dict[int, PathCost]:
    """The paths `which` (indices into `paths`, run by `runners` and `verify`) timed in full: one path at a time,
    its repeats in turn; within a repeat its sizes and top_ks are interleaved, so drift on a shared machine hits
    them alike (a path's sizes at one KV length run back to back, after an untimed forward of that path, and T(n)
    is read from their differences: `paired_curve`). Paths timed amid each other's repeats gave the int4 path a
    flatter curve than its decoding loop shows (2-core Zen 5 EPYC, at 256 cached tokens: T(1) 4.06-4.21 ms against
    3.71 timed alone, T(8) - T(1) 1.5 ms against 2.1 alone and 2.6 in the loop), and the tree choice then took a
    3-token Gumiho tree that ran 5% slower than the 2-token one. Repeat 0 warms up and is not kept, except for a
    size that cost STEEP one-token steps there: it is too slow to be chosen, so that one measurement stands (a
    64-token bf16 forward on a CPU without bf16 units takes a second)."""
    ids, features = inputs
    jobs = _jobs(drafters, top_ks)
    costs = {}
    for i in which:  # one path at a time
        draft = {m: DraftTimer(runners[i], drafter_for(d, runners[i]), m, ids, features,
                               before=lambda v=verify[i][0]: v(1)) for m, d in sorted(drafters.items())}
        warm: list[dict[int, float]] = [{} for _ in KV_LENGTHS]
        times: dict[tuple, list[float]] = {job: [] for job in jobs}  # job -> its timings, repeat 0's left out
        for r in range(repeats + 1):
            for key, size in jobs:
                if isinstance(key, int):
                    if not (r and warm[key][size] > STEEP * warm[key][1]):
                        if size == SIZES[0]:  # untimed: a forward of this path first, as the previous cycle's
                            verify[i][key](1)
                        ms = verify[i][key](size)
                        if r:
                            times[key, size].append(ms)
                        else:
                            warm[key][size] = ms
                else:
                    ms = draft[key](*size)
                    if r:
                        times[key, size].append(ms)
                bar.step()
        draft_ms: dict[str, dict[int, float]] = {m: {} for m in drafters}
        small_ms: dict[str, dict[int, dict[int, float]]] = {}
        for (key, size), samples in times.items():
            if isinstance(key, str):
                k, n = size
                if n:
                    small_ms.setdefault(key, {}).setdefault(k, {})[n] = low(samples)
                else:
                    draft_ms[key][k] = low(samples)
        curves = {kv: paired_curve({n: times[j, n] for n in SIZES}, warm[j]) for j, kv in enumerate(KV_LENGTHS)}
        head_ms, head_alone_ms = head_row_ms(runners[i], features[-1:].to(runners[i].dtype))
        costs[i] = PathCost(paths[i], curves, draft_ms, head_ms, small_ms, runners[i].head_batches, head_alone_ms)
    return costs


def measure(target: Target, drafters: dict[str, Drafter], paths: list[ExecPath] | None = None,
            repeats: int = REPEATS, top_ks: tuple[int, ...] = TOP_KS, progress: bool = True,
            on_progress: Callable[[float], None] | None = None, screen: bool = True) -> MachineProfile:
    """Time the candidate paths. `target` is the target as loaded (fp32 on CPU, half precision on a GPU).

    First every path's one-token step (`_screen`). The fastest there is timed in full (`_time_paths`), and so is
    every other path, unless (`screen`) its one-token step shows that it cannot be the fastest for any method at
    automatic trees even if it ran SCREEN_SLACK times faster and drafted for free (`choice.outpaced`): that one is
    kept as a screened PathCost, and timed in full only if a choice needs it (`complete`). On the 2-core Zen 4 EPYC
    a one-token step of the five float paths costs 3.5-7x the int4 path's; timing them in full took three quarters
    of the profile's 228 s."""
    paths = paths or candidate_paths(target.device, target.forward)
    runners = [target_for(target, path) for path in paths]
    verify = [[VerifyTimer(r, kv) for kv in KV_LENGTHS] for r in runners]
    inputs = _draft_inputs(target)
    start = time.perf_counter()
    bar = _Progress(progress, on_progress)
    full = (repeats + 1) * len(_jobs(drafters, top_ks))  # one path's timing in full
    bar.add((repeats + 1) * len(paths) * len(KV_LENGTHS) + full)  # the screen and the fastest path's
    try:
        ones = _screen(verify, repeats, bar)
        order = sorted(range(len(paths)), key=lambda i: ones[i][0])
        timed = _time_paths(paths, runners, verify, drafters, inputs, order[:1], repeats, top_ks, bar)
        screened = {i: PathCost(paths[i], {kv: [ones[i][j]] * len(SIZES) for j, kv in enumerate(KV_LENGTHS)},
                                screened=True) for i in order[1:]}
        rivals = order[1:]
        if screen:
            from .choice import outpaced  # choice.py reads this module

            acceptance = {m: d.acceptance for m, d in drafters.items()}
            rivals = [i for i in rivals if not outpaced(screened[i], timed[order[0]], ["ar", *sorted(drafters)],
                                                        acceptance, target.device.type)]
        bar.add(full * len(rivals))
        timed.update(_time_paths(paths, runners, verify, drafters, inputs, rivals, repeats, top_ks, bar))
    finally:
        bar.close()
    costs = [timed.get(i) or screened[i] for i in range(len(paths))]
    texts = greedy_texts(runners[order[0]], calibration_prompts(), TEXT_TOKENS, TEXT_PROMPTS)
    return MachineProfile(signature=signature(target.device), model=target.name,
                          drafters={m: drafter_key(d) for m, d in drafters.items()}, costs=costs,
                          seconds=round(time.perf_counter() - start, 1), texts=texts)


def calibration_prompts() -> list[str]:
    """The calibration prompts (data/calibration: generic ones, then task-shaped ones of four kinds in turn), in an
    order that spreads any first few over them; the generic ones where the file is not there."""
    try:
        prompts = read_prompts(CALIBRATION_PROMPTS)
    except GumihoError:
        return list(GENERIC_PROMPTS)
    step = max(1, len(prompts) // TEXT_PROMPTS)
    return [prompts[i] for start in range(step) for i in range(start, len(prompts), step)]


def greedy_texts(target: Target, prompts: list[str], tokens: int, count: int) -> list[tuple[int, list[int]]]:
    """`target`'s greedy replies (its AR decoding, as a run's) of up to `tokens` tokens to the first `count` prompts
    (chat template) of at most TEXT_PROMPT_TOKENS tokens that leave room for them, as (prompt length, ids)."""
    from .engine import Engine, GenerationConfig  # the engine's choice reads this module

    engine, config = Engine(target), GenerationConfig(max_new_tokens=tokens, trace=False)
    texts: list[tuple[int, list[int]]] = []
    for prompt in prompts:
        if len(texts) == count:
            break
        ids = target.encode_prompt(prompt)
        if len(ids) + tokens <= min(target.max_context, TEXT_PROMPT_TOKENS + tokens):
            texts.append((len(ids), ids + engine.generate("", "ar", config, prompt_ids=ids).token_ids))
    return texts


def cached_profile(target: Target, drafters: dict[str, Drafter]) -> MachineProfile | None:
    """The cached profile for this machine and model that timed (at least) these drafters' shapes and every
    candidate path, or None. An entry measured on another machine, or that does not parse, is never used."""
    return _read_store(target, drafters)[0]


def _read_store(target: Target, drafters: dict[str, Drafter]) -> tuple[MachineProfile | None, dict]:
    path, key = profile_path(target), profile_key(target)
    wanted = {m: drafter_key(d) for m, d in drafters.items()}
    store: dict = {}
    try:
        store = json.loads(path.read_text())
        if not isinstance(store, dict):
            raise ProfileError("not a profile store")
        for entry in store.get(key, []):
            profile = MachineProfile.from_dict(entry)
            if profile.signature != signature(target.device):
                log.info("the profile in %s was measured on another machine", path)
            elif (wanted.items() <= profile.drafters.items()
                  and [c.path for c in profile.costs] == candidate_paths(target.device, target.forward)):
                return profile, store
    except FileNotFoundError:
        pass
    except (OSError, json.JSONDecodeError, ProfileError, TypeError) as exc:
        log.warning("ignoring the unreadable machine profile %s (%s)", path, exc)
        store = {}
    return None, store


def load_or_measure(target: Target, drafters: dict[str, Drafter], progress: bool = True,
                    on_progress: Callable[[float], None] | None = None) -> MachineProfile:
    """`cached_profile`, or a new measurement, then cached."""
    profile, store = _read_store(target, drafters)
    if profile is not None:
        return profile
    log.info("measuring this machine (once; cached in %s)", profile_path(target))
    from .bench.machine import campaign_paused

    with campaign_paused():  # measured alone, as a run is: the cache outlives any background load
        profile = measure(target, drafters, progress=progress, on_progress=on_progress)
    _store(target, profile, store)
    return profile


def complete(target: Target, drafters: dict[str, Drafter], profile: MachineProfile, paths: list[ExecPath],
             progress: bool = True, on_progress: Callable[[float], None] | None = None) -> MachineProfile:
    """`profile` with its screened `paths` timed in full (a choice that their screen cannot decide: a fixed dtype,
    a fixed tree), then cached in its place."""
    wanted = [c.path for c in profile.costs if c.screened and c.path in paths]
    if not wanted:
        return profile
    log.info("timing %s in full for this choice (once; cached in %s)", ", ".join(p.label for p in wanted),
             profile_path(target))
    from .bench.machine import campaign_paused

    runners = [target_for(target, path) for path in wanted]
    verify = [[VerifyTimer(r, kv) for kv in KV_LENGTHS] for r in runners]
    start = time.perf_counter()
    bar = _Progress(progress, on_progress)
    bar.add((REPEATS + 1) * len(_jobs(drafters, TOP_KS)) * len(wanted))
    try:
        with campaign_paused():
            timed = _time_paths(wanted, runners, verify, drafters, _draft_inputs(target), list(range(len(wanted))),
                                REPEATS, TOP_KS, bar)
    finally:
        bar.close()
    full = {cost.path: cost for cost in timed.values()}
    profile = replace(profile, costs=[full.get(c.path, c) for c in profile.costs],
                      seconds=round(profile.seconds + time.perf_counter() - start, 1))
    _store(target, profile, _read_store(target, drafters)[1])
    return profile


def _store(target: Target, profile: MachineProfile, store: dict) -> None:
    """Keep `profile` first among this machine and model's entries in the profile file, in place of any entry it
    renews (the same drafters and signature), up to three others after it."""
    path, key = profile_path(target), profile_key(target)
    renews = (profile.drafters, profile.signature)
    others = [e for e in store.get(key, [])
              if isinstance(e, dict) and (e.get("drafters"), e.get("signature")) != renews]
    store[key] = [profile.to_dict()] + others[:3]
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(store, indent=1))
    tmp.replace(path)
