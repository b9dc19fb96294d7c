"""Draft losses (docs/design.md §14.2) on rows already selected by the loss mask, so masked rows cost nothing."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def feature_loss(predicted: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """SmoothL1 (beta 1) averaged over the hidden size, then over rows. [N, H] x [N, H] -> scalar."""
    if predicted.shape[0] == 0:
        return predicted.sum() * 0
    return F.smooth_l1_loss(predicted.float(), target.float(), beta=1.0)


def soft_cross_entropy(logits: torch.Tensor, teacher_logits: torch.Tensor) -> torch.Tensor:
    """-sum_v p_T(v) log q(v), with p_T = softmax(teacher_logits) (T = 1), averaged over rows. [N, V] each."""
    if logits.shape[0] == 0:
        return logits.sum() * 0
    teacher = torch.softmax(teacher_logits.float(), -1)
    return -(teacher * torch.log_softmax(logits.float(), -1)).sum(-1).mean()


def head_weights(heads: int, decay: float = 0.8, normaliser: float = 9.0) -> list[float]:
    """Weight of MLP head i (0-based): decay^(i+1) / normaliser (0.8, 0.64, ... over 9 in the released recipe)."""
    return [decay ** (i + 1) / normaliser for i in range(heads)]
