"""The training forward (spec §5.3) and the weighted loss (spec §5.4) for one batch.

Alignment, with features f_j and tokens x_j of one sequence:
  slot j of the Transformer reads fc([e(x_{j+1}); f_j + noise]) and its output h_j regresses f_{j+1}
  (the distribution of x_{j+2}); it counts where x_{j+2} is an assistant token.
  Gumiho's MLP input at slot t is [fc([e(x_{t+2}); h_t]) ; fc([e(x_{t+3}); h_{t+1}])] (ground-truth tokens, h not
  detached); head i regresses f_{t+3+i} and counts where x_{t+4+i} is an assistant token.
Logits everywhere are over the drafter's vocabulary (`drafter.head_weight`, possibly a draft vocabulary).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..drafters import Drafter, GumihoDrafter
from .batches import Batch
from .losses import feature_loss, head_weights, soft_cross_entropy


@dataclass
class LossWeights:
    feature: float = 1.0
    ce: float = 0.1
    mlp_feature: float = 1.0
    mlp_ce: float = 0.1  # only while `mlp_ce_on`
    mlp_decay: float = 0.8
    mlp_normaliser: float = 9.0


def input_noise(shape: torch.Size, amplitude: float, generator: torch.Generator | None, device) -> torch.Tensor:
    """Uniform noise of +-amplitude*256/T (T = padded length), as in the released code's `data_noise`."""
    if amplitude <= 0:
        return torch.zeros(shape, device=device)
    scale = amplitude * 512 / shape[1]
    return (torch.rand(shape, generator=generator).to(device) - 0.5) * scale


def _prediction_terms(drafter: Drafter, predicted: torch.Tensor, target: torch.Tensor, with_ce: bool):
    """Feature loss, and unless `with_ce` is off: soft CE and top-1 agreement with the target, on selected rows.
    Without CE the logits are skipped entirely: they are most of an MLP head's cost."""
    lv = feature_loss(predicted, target)
    if not with_ce:
        return lv, None, None
    head = drafter.head_weight
    with torch.no_grad():
        teacher = target @ head.T
    logits = predicted @ head.T
    lp = soft_cross_entropy(logits, teacher)
    with torch.no_grad():
        agree = (logits.argmax(-1) == teacher.argmax(-1)).float().mean() if predicted.shape[0] else torch.zeros(())
    return lv, lp, agree


def batch_losses(
    drafter: Drafter,
    batch: Batch,
    weights: LossWeights,
    noise: float = 0.0,
    mlp_ce_on: bool = True,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Total loss and its parts (floats, for logging) for one batch."""
    ids, mask, feats = batch.input_ids, batch.loss_mask, batch.features
    b, t, hidden = feats.shape
    dev = feats.device
    inputs = feats[:, :-1] + input_noise(feats[:, :-1].shape, noise, generator, dev)
    h = drafter.transformer(drafter.transformer.fuse(drafter.embed(ids[:, 1:]), inputs), torch.arange(t - 1, device=dev))

    serial = mask[:, 2:]
    lv, lp, agree = _prediction_terms(drafter, h[:, : t - 2][serial], feats[:, 1: t - 1][serial], True)
    total = weights.feature * lv + weights.ce * lp
    parts = {"lv": lv.item(), "lp": lp.item(), "acc1": agree.item()}

    if isinstance(drafter, GumihoDrafter) and t >= 5:
        n, heads = t - 4, drafter.config.mlp_heads
        first = drafter.transformer.fuse(drafter.embed(ids[:, 2: 2 + n]), h[:, :n])
        second = drafter.transformer.fuse(drafter.embed(ids[:, 3: 3 + n]), h[:, 1: 1 + n])
        mask_pad = torch.cat([mask, mask.new_zeros(b, heads)], 1)
        feats_pad = torch.cat([feats, feats.new_zeros(b, heads, hidden)], 1)
        head_masks = torch.stack([mask_pad[:, 4 + i: 4 + i + n] for i in range(heads)])  # [heads, B, n]
        rows = head_masks.any(0)
        if rows.any():
            predicted = drafter.heads(torch.cat([first, second], -1)[rows])  # [heads, R, H]
            for i, w in enumerate(head_weights(heads, weights.mlp_decay, weights.mlp_normaliser)):
                keep = head_masks[i][rows]
                target = feats_pad[:, 3 + i: 3 + i + n][rows][keep]
                lv_i, lp_i, agree_i = _prediction_terms(drafter, predicted[i][keep], target, mlp_ce_on)
                total = total + w * weights.mlp_feature * lv_i
                if mlp_ce_on:
                    total = total + w * weights.mlp_ce * lp_i
                parts[f"lv_mlp{i}"] = lv_i.item()
                if mlp_ce_on:
                    parts[f"acc_mlp{i}"] = agree_i.item()
    parts["loss"] = total.item()
    return total, parts
