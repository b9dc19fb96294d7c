"""One logits-processing and sampling path, shared by every method (AR, the bonus token, tree verification)."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from .errors import GumihoError
from .kernels import row_ops


@dataclass(frozen=True)
class SamplingConfig:
    """temperature 0 means greedy; top_p 1.0 and top_k 0 switch those filters off."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0

    def __post_init__(self) -> None:
        if not self.temperature >= 0:
            raise GumihoError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise GumihoError(f"top-p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise GumihoError(f"top-k must be >= 0, got {self.top_k}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def to_dict(self) -> dict:
        return asdict(self)


def probabilities(logits: torch.Tensor, cfg: SamplingConfig) -> torch.Tensor:
    """The distribution a token is sampled from: temperature, then top-k, then top-p, renormalised (fp32, on CPU)."""
    logits = logits.float().cpu() / cfg.temperature
    if cfg.top_k and cfg.top_k < logits.shape[-1]:
        kth = torch.topk(logits, cfg.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if cfg.top_p < 1:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        drop_sorted = ~nucleus(sorted_logits.softmax(-1), cfg.top_p)
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits.softmax(-1)


def nucleus(sorted_probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Top-p over probabilities sorted in descending order: keep a token unless the tokens ranked above it already
    reach top_p (so the top token always stays)."""
    return (sorted_probs.cumsum(-1) - sorted_probs) < top_p


def sample(probs: torch.Tensor, generator: torch.Generator) -> int:
    return int(torch.multinomial(probs, 1, generator=generator))


def greedy_token(logits: torch.Tensor) -> int:
    """torch.argmax of one row of logits [V], through the compiled kernel for a CPU's fp32 rows (kernels/rows.cpp:
    about 5 us for 49,152 entries where torch's takes 28, once per decode step)."""
    ops = row_ops() if logits.device.type == "cpu" and logits.dtype == torch.float32 and logits.dim() == 1 else None
    return int(ops.argmax(logits)) if ops is not None else int(logits.argmax())


def pick(logits: torch.Tensor, cfg: SamplingConfig, generator: torch.Generator) -> int:
    """The next token from one row of logits: argmax when greedy, else a sample from `probabilities`."""
    if cfg.greedy:
        return greedy_token(logits)
    return sample(probabilities(logits, cfg), generator)
