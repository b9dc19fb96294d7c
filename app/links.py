"""Durable links: the page's state as URL query parameters, and back.

    ?tab=explore&example=3-haiku&method=gumiho&cycle=4&present=1
    ?tab=race&prompt=Name+three+fruits.&methods=eagle2,gumiho&temperature=0&max_new_tokens=32&top_k=4

`LinkState.parse` reads what a visitor's browser sends (anything at all) and keeps what it can use: a parameter
that is unknown or malformed is left out, with a one-line reason for the page. Nothing here is escaped: whoever
shows a reason escapes it. Whether an example exists, a method is loaded or a cycle is inside its run is for the
page to check (it knows the examples and the engine).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

from . import validate
from .validate import InvalidInput, Limits, Range, excerpt

TABS = ("explore", "race", "bench", "lesson")
# The numeric settings, in link order: sampling first, then the draft tree.
NUMBERS = ("temperature", "top_p", "seed", "max_new_tokens", "top_k", "depth", "total_tokens", "mlptopk", "pruning",
           "tau_acc")
# A longer prompt would make a link that proxies and chat apps cut (a URL of more than a few thousand characters;
# percent-encoding triples punctuation and non-Latin text).
MAX_PROMPT_CHARS = 2000
CYCLE = Range("cycle", 0, 100_000)
EXAMPLE_NAME = re.compile(r"[\w.-]{1,64}")
SCRIPT = re.compile(r"<\s*/?\s*script|javascript\s*:|<[^>]*\bon[a-z]+\s*=", re.IGNORECASE)
TRUE, FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")
GRADIO_PREFIX = "__"  # Gradio's own parameters (?__theme=dark)
UNKNOWN_SHOWN = 3  # unknown parameter names named in the message; the rest are counted


@dataclass(frozen=True)
class LinkState:
    """What a link restores. None (or empty) means "as the page opens"."""

    tab: str = "explore"
    example: str | None = None  # a recorded example's name (a folder of assets/traces/)
    prompt: str | None = None
    method: str | None = None  # Explore's method
    methods: tuple[str, ...] | None = None  # a race's drafted methods (AR always runs)
    settings: dict[str, int | float] = field(default_factory=dict)  # NUMBERS present in the link
    fta: bool | None = None
    cycle: int | None = None
    present: bool = False

    @classmethod
    def parse(cls, query: Mapping[str, str], limits: Limits = Limits()) -> tuple[LinkState, list[str]]:
        """The state a query asks for, and why each parameter left out was left out (plain text, one short
        sentence each)."""
        values: dict[str, Any] = {}
        problems: list[str] = []
        unknown: list[str] = []
        for name, raw in query.items():
            if name.startswith(GRADIO_PREFIX):
                continue
            reader = READERS.get(name)
            if reader is None:
                unknown.append(name)
                continue
            try:
                values[name] = reader(raw, limits)
            except InvalidInput as exc:
                problems.append(str(exc))
            if name == "prompt" and SCRIPT.search(raw):
                problems.append("the prompt holds script-like markup: it is kept as plain text and never run")
        if unknown:
            shown = ", ".join(excerpt(name, 24) for name in unknown[:UNKNOWN_SHOWN])
            more = f" and {len(unknown) - UNKNOWN_SHOWN:,} more" if len(unknown) > UNKNOWN_SHOWN else ""
            problems.insert(0, f"unknown parameter{'s' if len(unknown) > 1 else ''} {shown}{more}")
        settings = {name: values.pop(name) for name in NUMBERS if name in values}
        return cls(settings=settings, **values), problems

    def to_query(self) -> str:
        """The query string (without "?") of this state; `parse` reads it back to an equal state."""
        pairs: list[tuple[str, str]] = []
        for name in ("tab", "example", "method"):
            if getattr(self, name):
                pairs.append((name, getattr(self, name)))
        if self.methods:
            pairs.append(("methods", ",".join(self.methods)))
        if self.cycle is not None:
            pairs.append(("cycle", str(self.cycle)))
        if self.prompt:
            pairs.append(("prompt", self.prompt))
        pairs += [(name, _text(self.settings[name])) for name in NUMBERS if name in self.settings]
        if self.fta is not None:
            pairs.append(("fta", "1" if self.fta else "0"))
        if self.present:
            pairs.append(("present", "1"))
        return urlencode(pairs)

    def pinned(self) -> set[str]:
        """The names of the settings this link sets (the page keeps them when the engine's defaults arrive)."""
        return set(self.settings) | ({"fta"} if self.fta is not None else set())


def _text(value: int | float) -> str:
    return str(value) if isinstance(value, int) else repr(float(value))  # repr: the shortest exact form


def _number(range_: Range, raw: str) -> int | float:
    """A parameter's text as a number (its range is checked by `validate.number`)."""
    for kind in (int, float):
        try:
            return kind(raw)
        except (ValueError, OverflowError):
            pass
    raise InvalidInput(f"{range_.label} must be a number ({range_.text()}), got {excerpt(raw)}")


def _tab(raw: str, limits: Limits) -> str:
    if raw not in TABS:
        raise InvalidInput(f"tab must be one of {', '.join(TABS)}, got {excerpt(raw)}")
    return raw


def _example(raw: str, limits: Limits) -> str:
    if not EXAMPLE_NAME.fullmatch(raw):
        raise InvalidInput(f"example must be a recorded example's name, got {excerpt(raw)}")
    return raw


def _prompt(raw: str, limits: Limits) -> str:
    prompt = validate.prompt(raw, limits)
    if len(prompt) > MAX_PROMPT_CHARS:
        raise InvalidInput(f"the prompt is {len(prompt):,} characters; a link carries prompts of up to "
                           f"{MAX_PROMPT_CHARS:,}")
    return prompt


def _methods(raw: str, limits: Limits) -> tuple[str, ...]:
    """Comma-separated drafted methods; "ar" may be named too (it always runs)."""
    names = [name.strip() for name in raw.split(",") if name.strip() and name.strip() != "ar"]
    return tuple(validate.race_methods(names))


def _cycle(raw: str, limits: Limits) -> int:
    return validate.number(CYCLE, _number(CYCLE, raw))


def _method(raw: str, limits: Limits) -> str:
    return validate.method(raw)


def _setting(name: str) -> Callable[[str, Limits], int | float]:
    def read(raw: str, limits: Limits) -> int | float:
        return validate.number(limits.range(name), _number(limits.range(name), raw))
    return read


def _flag(name: str) -> Callable[[str, Limits], bool]:
    def read(raw: str, limits: Limits) -> bool:
        if raw.lower() not in TRUE + FALSE:
            raise InvalidInput(f"{name} must be 1 or 0, got {excerpt(raw)}")
        return raw.lower() in TRUE
    return read


READERS: dict[str, Callable[[str, Limits], Any]] = {
    "tab": _tab, "example": _example, "prompt": _prompt, "method": _method, "methods": _methods, "cycle": _cycle,
    "fta": _flag("fta"), "present": _flag("present"), **{name: _setting(name) for name in NUMBERS},
}
