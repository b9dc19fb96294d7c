"""Output perplexity under the target: how likely the target finds a generated continuation (MJSD's quality metric)."""

from __future__ import annotations

import math

import torch

from .errors import GumihoError
from .target import Target


@torch.inference_mode()
def perplexity(target: Target, prompt_ids: list[int], output_ids: list[int]) -> float:
    """exp of the mean negative log-likelihood of `output_ids`, each given the prompt and the output before it,
    under the target's plain softmax (T = 1, no filter). One forward over prompt + output; the last output token is
    only scored, so a run that filled the context still fits."""
    if not prompt_ids or not output_ids:
        raise GumihoError("perplexity needs a prompt and at least one output token")
    ids = torch.tensor(prompt_ids + output_ids, device=target.device)
    logits = target.logits(target.features(ids[:-1], target.new_cache()))[len(prompt_ids) - 1 :]
    nll = -torch.log_softmax(logits, -1).gather(1, ids[len(prompt_ids) :, None]).mean()
    return math.exp(float(nll))
