"""The chain-acceptance model behind "why early tokens matter": τ = Σ_k Π_{i≤k} p_i."""

from __future__ import annotations

from dataclasses import dataclass
from math import prod

MAX_POSITIONS = 16


@dataclass(frozen=True)
class Chain:
    """Per-position acceptance probabilities p_1..p_K of one draft chain."""

    p: tuple[float, ...]

    @classmethod
    def parse(cls, text: str) -> Chain:
        """'0.8, 0.8, 0.8' -> Chain; raises ValueError with a message meant for the user."""
        items = [item for item in text.replace(";", ",").replace(" ", ",").split(",") if item]
        if not items:
            raise ValueError("enter acceptance probabilities, e.g. 0.8, 0.8, 0.8")
        if len(items) > MAX_POSITIONS:
            raise ValueError(f"at most {MAX_POSITIONS} positions")
        try:
            values = tuple(float(item) for item in items)
        except ValueError:
            raise ValueError("use numbers between 0 and 1 separated by commas, e.g. 0.85, 0.8, 0.75") from None
        if any(not 0 <= v <= 1 for v in values):
            raise ValueError("every probability must be between 0 and 1")
        return cls(values)

    def terms(self) -> list[float]:
        """Π_{i≤k} p_i for k = 1..K: the probability that the first k draft tokens are all accepted."""
        return [prod(self.p[:k]) for k in range(1, len(self.p) + 1)]

    @property
    def tau(self) -> float:
        """Expected accepted draft tokens per cycle (the bonus token not included)."""
        return sum(self.terms())

    def gradient(self) -> list[float]:
        """∂τ/∂p_j = (Π_{i<j} p_i) · (1 + Σ_{k>j} Π_{j<i≤k} p_i): how much τ gains per unit of p_j."""
        grads = []
        for j in range(len(self.p)):
            tail = 1.0 + sum(prod(self.p[j + 1 : k + 1]) for k in range(j + 1, len(self.p)))
            grads.append(prod(self.p[:j]) * tail)
        return grads
