"""Every value a visitor or an API caller sends, checked in one place before the engine sees it.

Two kinds of refusal: `InvalidInput` (a value of the right type outside its range, or an unreadable upload: shown
on the page as a message) and `WrongType` (a value no control on the page can send, so an API call: raised to the
caller as `gr.Error`). Both name the field and what it accepts, and never echo more than a short excerpt of what
was sent; whoever shows a message escapes it.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gumiho.errors import GumihoError
from gumiho.trace import DRAFTED_METHODS, METHODS, GenerationTrace, TraceError

SEED_MAX = 2**63 - 1
MAX_JSON_DEPTH = 16  # a trace nests about 5 levels (trace > steps > cycle > nodes > node)
MAX_UPLOAD_BYTES = 20 * 1024 * 1024
CHARS_PER_TOKEN = 16  # a prompt longer than this many characters per allowed token is refused before tokenizing


class InvalidInput(GumihoError):
    """A value of the right type that the app does not accept; the message names the field and its range."""


class WrongType(InvalidInput):
    """A value of a type no control on the page sends (an API call with a wrong or missing argument)."""


@dataclass(frozen=True)
class Range:
    """The allowed values of one numeric field, and how the page labels it."""

    label: str
    low: float
    high: float
    integer: bool = True

    def text(self, joiner: str = "to") -> str:
        high = "2^63-1" if self.high == SEED_MAX else f"{self.high:g}"
        return f"{self.low:g} {joiner} {high}"


FIELDS = {
    "temperature": Range("temperature", 0, 2, integer=False),
    "top_p": Range("top-p", 0.05, 1, integer=False),
    "seed": Range("seed", 0, SEED_MAX),
    "top_k": Range("top-k", 1, 16),
    "depth": Range("depth", 1, 8),
    "total_tokens": Range("total tokens", 1, 64),  # 1: the root alone, plain AR steps (what a slow machine picks)
    "mlptopk": Range("mlptopk", 1, 40),
    "pruning": Range("pruning", 1, 40),
    "tau_acc": Range("τ_acc", 0, 1, integer=False),
}


@dataclass(frozen=True)
class Limits:
    """What one request may ask of the single engine worker (command-line flags of `python app.py`)."""

    max_prompt_tokens: int = 2048
    max_new_tokens: int = 512
    max_run_seconds: float = 120.0

    def describe(self) -> str:
        return (f"prompts up to {self.max_prompt_tokens:,} tokens, up to {self.max_new_tokens:,} new tokens, "
                f"{self.max_run_seconds:g} s per run")

    def range(self, name: str) -> Range:
        if name == "max_new_tokens":
            return Range("max new tokens", 1, self.max_new_tokens)
        return FIELDS[name]


def excerpt(value: Any, width: int = 40) -> str:
    """A short rendering of something a user sent, for a message."""
    text = repr(value)
    return text if len(text) <= width else text[: width - 1] + "…"


def number(range_: Range, value: Any) -> float | int:
    """`value` as a finite number inside `range_`; bool and non-numbers are WrongType."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise WrongType(f"{range_.label} must be a number ({range_.text()}), got {excerpt(value)}")
    if isinstance(value, float) and not math.isfinite(value):
        raise InvalidInput(f"{range_.label} must be a finite number ({range_.text()}), got {value}")
    if range_.integer and value != int(value):
        raise InvalidInput(f"{range_.label} must be a whole number ({range_.text()}), got {value:g}")
    if not range_.low <= value <= range_.high:
        shown = excerpt(value) if isinstance(value, int) else f"{value:g}"
        raise InvalidInput(f"{range_.label} must be between {range_.text('and')}, got {shown}")
    return int(value) if range_.integer else float(value)


def text(label: str, value: Any) -> str:
    if not isinstance(value, str):
        raise WrongType(f"{label} must be a string, got {excerpt(value)}")
    return value


def flag(label: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise WrongType(f"{label} must be true or false, got {excerpt(value)}")
    return value


def method(value: Any) -> str:
    if text("method", value) not in METHODS:
        raise InvalidInput(f"method must be one of {', '.join(METHODS)}, got {excerpt(value)}")
    return value


def race_methods(value: Any) -> list[str]:
    """The drafted methods a race compares (AR always runs too): at least one, each a drafted method."""
    if not isinstance(value, (list, tuple)) or not all(isinstance(m, str) for m in value):
        raise WrongType(f"methods must be a list of method names, got {excerpt(value)}")
    unknown = [m for m in value if m not in DRAFTED_METHODS]
    if unknown:
        raise InvalidInput(f"methods must be among {', '.join(DRAFTED_METHODS)}, got {excerpt(unknown[0])}")
    if not value:
        raise InvalidInput("pick at least one method to race against AR")
    return list(dict.fromkeys(value))


def prompt(value: Any, limits: Limits) -> str:
    """A non-empty prompt of plausible length; the exact token count is checked once tokenized (service.stream)."""
    value = text("prompt", value)
    if not value.strip():
        raise InvalidInput("the prompt is empty")
    if len(value) > CHARS_PER_TOKEN * limits.max_prompt_tokens:
        raise InvalidInput(f"the prompt is {len(value):,} characters; this app accepts prompts of up to "
                           f"{limits.max_prompt_tokens:,} tokens")
    return value


def prompt_tokens(count: int, limits: Limits) -> None:
    if count > limits.max_prompt_tokens:
        raise InvalidInput(f"the prompt is {count:,} tokens; this app accepts at most {limits.max_prompt_tokens:,}")


def numbers(limits: Limits, **values: Any) -> dict[str, int | float]:
    """Each named numeric setting checked against its range (`FIELDS`, or the limits for max_new_tokens)."""
    return {name: number(limits.range(name), value) for name, value in values.items()}


def json_depth(source: str) -> int:
    """How deeply arrays and objects nest in a JSON text (strings skipped), without building it."""
    depth = deepest = 0
    for bracket in re.findall(r"[\[\]{}]", re.sub(r'"(?:[^"\\]|\\.)*"', '""', source)):
        depth += 1 if bracket in "[{" else -1
        deepest = max(deepest, depth)
    return deepest


def trace_file(path: Any) -> GenerationTrace:
    """An uploaded trace, read with a size and a nesting limit; raises InvalidInput with a readable reason."""
    if not isinstance(path, (str, Path)):
        raise WrongType(f"trace file must be an uploaded file, got {excerpt(path)}")
    file = Path(path)
    try:
        if file.stat().st_size > MAX_UPLOAD_BYTES:
            raise InvalidInput(f"the file is larger than {MAX_UPLOAD_BYTES // 2**20} MB; a trace is far smaller")
        source = file.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise InvalidInput("the file is not UTF-8 text (expected a trace JSON file)") from None
    except OSError as exc:
        raise InvalidInput(f"cannot read the file: {exc.strerror}") from None
    if json_depth(source) > MAX_JSON_DEPTH:
        raise InvalidInput(f"the file nests more than {MAX_JSON_DEPTH} levels deep; it is not a trace")
    try:
        return GenerationTrace.from_dict(json.loads(source))
    except json.JSONDecodeError as exc:
        raise InvalidInput(f"not valid JSON: {exc.msg} (line {exc.lineno})") from None
    except TraceError as exc:
        raise InvalidInput(str(exc)) from None
