"""A stand-in for Hugging Face's `spaces` package on a ZeroGPU Space, for tests on any machine.

`GPU(duration=...)` does what ZeroGPU does at the boundary the app has to respect: every call is one GPU entry,
recorded in `entries` with the duration it asked for; arguments and yielded values are pickled on their way in and
out (a ZeroGPU worker is another process), and a value holding a tensor fails the call, as a CUDA tensor would hang
it there. `quota_s` is the visitor's GPU time left: a call asking for more is refused with ZeroGPU's own wording.
What it cannot stand in for: the real forked worker, device placement, and the quota server.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import pickle
from typing import Any

import gradio as gr
import torch

entries: list[dict] = []
inside = False  # whether a GPU call is running now
quota_s = float("inf")


def reset(quota: float = float("inf")) -> None:
    global quota_s, inside
    entries.clear()
    quota_s, inside = quota, False


def tensors_in(value: Any) -> list[str]:
    """Where `value` holds a torch tensor (plain containers and dataclasses are walked)."""
    if isinstance(value, torch.Tensor):
        return [f"tensor on {value.device}"]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return [t for f in dataclasses.fields(value) for t in tensors_in(getattr(value, f.name))]
    if isinstance(value, dict):
        return [t for k, v in value.items() for t in tensors_in(k) + tensors_in(v)]
    if isinstance(value, (list, tuple, set)):
        return [t for v in value for t in tensors_in(v)]
    return []


def _across(value: Any) -> Any:
    found = tensors_in(value)
    if found:
        raise AssertionError(f"a tensor crossed the GPU boundary: {found[0]}")
    return pickle.loads(pickle.dumps(value))


def GPU(task=None, *, duration=None, size=None):
    if task is None:
        return functools.partial(GPU, duration=duration, size=size)

    def enter(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        global inside
        seconds = duration(*args, **kwargs) if callable(duration) else (duration or 60)
        entries.append({"function": task.__name__, "duration": seconds})
        if seconds > quota_s:
            raise gr.Error(f"You have exceeded your free ZeroGPU quota ({round(seconds)}s requested vs. "
                           f"{round(quota_s)}s left). Try again in 13:17:29. ", title="ZeroGPU quota exceeded",
                           print_exception=False)
        inside = True
        return _across(args), _across(kwargs)

    if inspect.isgeneratorfunction(task):
        @functools.wraps(task)
        def generator(*args, **kwargs):
            global inside
            args, kwargs = enter(args, kwargs)
            try:
                for item in task(*args, **kwargs):
                    yield _across(item)
            finally:
                inside = False
        return generator

    @functools.wraps(task)
    def function(*args, **kwargs):
        global inside
        args, kwargs = enter(args, kwargs)
        try:
            return _across(task(*args, **kwargs))
        finally:
            inside = False
    return function
