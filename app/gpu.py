"""ZeroGPU: the engine's runs as the GPU functions of a Hugging Face Space, and nothing else.

On a ZeroGPU Space (`spaces` installed, `SPACES_ZERO_GPU` set) a GPU is attached only while a function decorated
with `spaces.GPU` runs, in a forked worker, and each call spends the visitor's daily quota. So:

- Generate and Race each enter the GPU once (`generate_traces`, `race_traces`: the whole run, not each cycle), with
  a `duration` estimated from the request. The model is loaded and placed on the device before the app launches;
  the machine profile and the warm-up run inside the first GPU call of each worker (`EngineLoader.prepare`), so
  that the three methods of a race are timed in one call on a warm device.
- Arguments and yields cross a process boundary: plain dataclasses only (settings in, `GenerationTrace`s out).
- Everything that can be shown without the model (recorded examples, races, replays, the lesson, links) never
  calls these functions.

Elsewhere `spaces` is absent, or its decorator returns the function unchanged: the same code runs in-process.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, TypeVar

try:  # preinstalled on every Space (never pinned in requirements.txt); absent elsewhere
    import spaces
except ImportError:
    spaces = None

from gumiho.trace import GenerationTrace

from .validate import Limits

if TYPE_CHECKING:
    from gumiho.engine import GenerationConfig

    from .service import Control, EngineLoader

F = TypeVar("F", bound=Callable)
PROFILE_S = 100  # the machine profile, measured in the first GPU call while none is cached (10 s of it for its
# greedy replies to calibration prompts: 1,024 one-token steps, profile.greedy_texts)
CALL_S = 15  # entering the GPU, a cold worker's warm-up, the prefill, the last yields
STEP_MS = 60.0  # a token's cost when no profile has been measured yet (generous: the estimate must not fall short)
SLACK = 2.0  # headroom over the profile's expected cost: a call that outlives its duration is killed
QUOTA_NOTE = ("The free GPU time for this visitor is used up for now (ZeroGPU counts it per visitor: 2 minutes a "
              "day without an account, 5 with a free one). The recorded examples and races on this page need no "
              "GPU: pick one above, replay a trace, or open a shared link.")

_loader: EngineLoader | None = None  # the one engine of this process, loaded before launch on ZeroGPU


def on_space() -> bool:
    """Whether this process runs on a Hugging Face Space (any hardware)."""
    return bool(os.environ.get("SPACE_ID"))


def on_zero_gpu() -> bool:
    """Whether this process runs on a ZeroGPU Space (the `spaces` package's own test of the environment)."""
    return spaces is not None and os.environ.get("SPACES_ZERO_GPU", "").lower() in ("1", "t", "true")


def serve(loader: EngineLoader) -> None:
    """Make `loader` the engine the GPU functions run on (module state: a forked GPU worker inherits it, and no
    engine could be pickled into one)."""
    global _loader
    _loader = loader


def gpu(duration: Callable[..., int]) -> Callable[[F], F]:
    """`spaces.GPU(duration=...)` where `spaces` is installed (it returns the function unchanged off ZeroGPU)."""
    def wrap(function: F) -> F:
        return spaces.GPU(duration=duration)(function) if spaces is not None else function
    return wrap


def quota_exhausted(exc: BaseException) -> bool:
    """Whether `exc` is ZeroGPU refusing a call for the visitor's quota (or one longer than it allows)."""
    text = f"{getattr(exc, 'title', '')} {exc}".lower()
    return "zerogpu" in text or "quota" in text or "gpu limit" in text


def estimate_seconds(methods: int, max_new_tokens: int, limits: Limits) -> int:
    """The GPU time to ask for: per method, every token at the profile's cost of an AR step (the slowest way to
    emit a token), with headroom, at most each run's time budget; plus the profile while none is cached."""
    chosen = _loader is not None and _loader.has_choice()
    step_ms = _loader.engine.choice.cost.verify_at(1) if chosen else STEP_MS
    runs = min(methods * max_new_tokens * step_ms * SLACK / 1e3, methods * limits.max_run_seconds)
    return math.ceil(CALL_S + (0 if chosen else PROFILE_S) + runs)


def _generate_seconds(prompt: str, method: str, config: GenerationConfig, limits: Limits, control: Control,
                      every_s: float) -> int:
    return estimate_seconds(1, config.max_new_tokens, limits)


def _race_seconds(prompt: str, configs: dict[str, GenerationConfig], limits: Limits, control: Control,
                  every_s: float) -> int:
    return estimate_seconds(len(configs) + 1, configs["ar"].max_new_tokens, limits)  # + transformers generate


def _engine():
    if _loader is None:
        raise RuntimeError("gpu.serve(loader) was not called")
    return _loader.prepare()


@gpu(duration=_generate_seconds)
def generate_traces(prompt: str, method: str, config: GenerationConfig, limits: Limits, control: Control,
                    every_s: float) -> Iterator[GenerationTrace]:
    """One Explore run: its trace at most every `every_s` seconds, then the finished one."""
    from .service import follow, stream

    engine = _engine()
    yield from follow(stream(engine, prompt, method, config, control, limits), every_s, control.stop)


@gpu(duration=_race_seconds)
def race_traces(prompt: str, configs: dict[str, GenerationConfig], limits: Limits, control: Control,
                every_s: float) -> Iterator[list[GenerationTrace]]:
    """One race, every method and the transformers baseline in this one call (their timings compare)."""
    from .service import follow, race

    engine = _engine()
    yield from follow(race(engine, prompt, configs, control, limits, _loader.reference()), every_s, control.stop)
