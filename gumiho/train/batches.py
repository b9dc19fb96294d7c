"""Right-padded training batches of cached sequences, grouped by length under a token budget."""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass

import torch
from torch.nn.utils.rnn import pad_sequence

from .features import Sequence

log = logging.getLogger(__name__)


@dataclass
class Batch:
    input_ids: torch.Tensor  # [B, T] int64, 0 after the end
    loss_mask: torch.Tensor  # [B, T] bool, False after the end; on the CPU (the losses index with it, see objective)
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
    """Pad where the sequences live (on the GPU when `on_device` put them there), then move to `device`; the loss
    mask stays on the CPU."""
    ids = pad_sequence([s.input_ids for s in sequences], batch_first=True)
    mask = pad_sequence([s.loss_mask.cpu() for s in sequences], batch_first=True)
    feats = pad_sequence([s.features for s in sequences], batch_first=True)
    return Batch(ids.to(device), mask, feats.to(device, torch.float32), sum(len(s.input_ids) for s in sequences))


def on_device(sequences: list[Sequence], device: torch.device, share: float = 0.5) -> list[Sequence]:
    """The training set moved to a GPU when it takes at most `share` of the free memory, so that batches are padded
    there instead of on the CPU and copied over at every step; otherwise unchanged."""
    if device.type != "cuda":
        return sequences
    size = sum(s.features.nbytes + s.input_ids.nbytes + s.loss_mask.nbytes for s in sequences)
    free, _ = torch.cuda.mem_get_info(device)
    if size > share * free:
        log.info("training data (%.1f GB) stays on the CPU: %.1f GB free on %s", size / 1e9, free / 1e9, device)
        return sequences
    return [Sequence(s.input_ids.to(device), s.loss_mask, s.features.to(device)) for s in sequences]
