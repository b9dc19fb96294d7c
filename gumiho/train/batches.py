"""Right-padded training batches of cached sequences, grouped by length under a token budget."""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch

from .features import Sequence


@dataclass
class Batch:
    input_ids: torch.Tensor  # [B, T] int64, 0 after the end
    loss_mask: torch.Tensor  # [B, T] bool, False after the end
    features: torch.Tensor  # [B, T, H] fp32, 0 after the end
    tokens: int  # real (unpadded) tokens


def plan_batches(lengths: list[int], batch_tokens: int) -> list[list[int]]:
    """Index groups of similar length whose padded size (count x longest) stays within `batch_tokens`."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    groups, current, longest = [], [], 0
    for i in order:
        longest_if_added = max(longest, lengths[i])
        if current and longest_if_added * (len(current) + 1) > batch_tokens:
            groups.append(current)
            current, longest_if_added = [], lengths[i]
        current.append(i)
        longest = longest_if_added
    if current:
        groups.append(current)
    return groups


def epoch_order(groups: list[list[int]], seed: int, epoch: int) -> list[list[int]]:
    order = list(groups)
    random.Random(seed * 1000 + epoch).shuffle(order)
    return order


def collate(sequences: list[Sequence], device: torch.device) -> Batch:
    width = max(len(s.input_ids) for s in sequences)
    hidden = sequences[0].features.shape[1]
    ids = torch.zeros(len(sequences), width, dtype=torch.long)
    mask = torch.zeros(len(sequences), width, dtype=torch.bool)
    feats = torch.zeros(len(sequences), width, hidden)
    for row, s in enumerate(sequences):
        n = len(s.input_ids)
        ids[row, :n], mask[row, :n], feats[row, :n] = s.input_ids, s.loss_mask, s.features.float()
    return Batch(ids.to(device), mask.to(device), feats.to(device), sum(len(s.input_ids) for s in sequences))
