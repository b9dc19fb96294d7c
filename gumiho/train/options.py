"""Config fields that carry their command-line help (`python -m gumiho.train ... --help`)."""

from __future__ import annotations

from dataclasses import MISSING, field
from typing import Any


def option(help: str, default: Any = MISSING) -> Any:
    """A dataclass field with `help` for its --option; without a default the option is required."""
    return field(default=default, metadata={"help": help})
