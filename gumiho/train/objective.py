"""The training forward (docs/design.md §14.1) and the weighted loss (docs/design.md §14.2) for one batch.

Alignment, with features f_j and tokens x_j of one sequence:
  slot j of the Transformer reads fc([e(x_{j+1}); f_j + noise]) and its output h_j regresses f_{j+1}
  (the distribution of x_{j+2}); it counts where x_{j+2} is an assistant token.
  Gumiho's MLP input at slot t is [fc([e(x_{t+2}); h_t]) ; fc([e(x_{t+3}); h_{t+1}])] (ground-truth tokens, h not
  detached); head i regresses f_{t+3+i} and counts where x_{t+4+i} is an assistant token.
  Medusa's and Hydra's head k at slot j reads f_j + noise (Hydra: and e(x_{j+1}) .. e(x_{j+k+1}), ground-truth
  tokens, teacher forcing as in Hydra's training); it regresses f_{j+k+1} and counts where x_{j+k+2} is an
  assistant token. These drafters have no Transformer term.
Logits everywhere are over the drafter's vocabulary (`drafter.head_weight`, possibly a draft vocabulary).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.nn import functional as F

from ..drafters import Drafter, GumihoDrafter, HeadDrafter
from ..drafters.layers import KVCache
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
    # Medusa, Hydra: head k's terms are weighted head_decay^k. Soft CE alone, as Medusa trains on CE: on held-out
    # data it drafted as well as or better than with the feature loss added (docs/training.md#medusa-and-hydra).
    head_feature: float = 0.0
    head_ce: float = 1.0
    head_decay: float = 0.8


def input_noise(shape: torch.Size, amplitude: float, generator: torch.Generator | None, device) -> torch.Tensor:
    """Uniform noise of +-amplitude*256/T (T = padded length), as in the released code's `data_noise`."""
    if amplitude <= 0:
        return torch.zeros(shape, device=device)
    scale = amplitude * 512 / shape[1]
    return (torch.rand(shape, generator=generator, device=device) - 0.5) * scale


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
        agree = (logits.argmax(-1) == teacher.argmax(-1)).float().mean() if predicted.shape[0] \
            else torch.zeros((), device=predicted.device)
    return lv, lp, agree


def _rows(mask: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Flat indices of a CPU mask's True entries, on `device`. Selecting rows with them never waits for a GPU,
    where a boolean mask living there would first have to count its True entries on the host."""
    return mask.flatten().nonzero().squeeze(1).to(device, non_blocking=True)


def _select(x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """x[..., :] flattened to [N, H], then the given rows."""
    return x.reshape(-1, x.shape[-1]).index_select(0, rows)


def unrolled_outputs(drafter: Drafter, ids: torch.Tensor, inputs: torch.Tensor, unroll: int) -> list[torch.Tensor]:
    """Draft outputs h^1..h^unroll [B, T-1, H] ("training-time test", as in HASS and EAGLE-3).

    h^1_j reads fc([e(x_{j+1}); f_j]) at position j, as always. Step k >= 2 feeds the draft its own previous output,
    as drafting does: slot j reads fc([e(x_{j+k}); h^{k-1}_j]) at position j+k-1 and attends to the true-feature
    keys of slots <= j and to its own keys from steps 2..k, exactly the context a depth-k draft node sees.
    h^k_j predicts f_{j+k}.
    """
    tr = drafter.transformer
    slots, dev = inputs.shape[1], inputs.device
    positions = torch.arange(slots, device=dev)
    first = tr.fuse(drafter.embed(ids[:, 1:]), inputs)
    if unroll == 1:
        return [tr(first, positions)]
    cache = KVCache(len(tr.layers))
    causal = torch.ones(slots, slots, dtype=torch.bool, device=dev).tril()
    own = torch.eye(slots, dtype=torch.bool, device=dev)
    outputs = [tr(first, positions, causal[None, None], cache)]
    for k in range(2, unroll + 1):
        tokens = F.pad(ids[:, k:], (0, slots))[:, :slots]  # x_{j+k} at slot j; 0 past the end (never counted)
        mask = torch.cat([causal] + [own] * (k - 1), 1)[None, None]
        outputs.append(tr(tr.fuse(drafter.embed(tokens), outputs[-1]), positions + k - 1, mask, cache))
    return outputs


def batch_losses(
    drafter: Drafter,
    batch: Batch,
    weights: LossWeights,
    noise: float = 0.0,
    mlp_ce_on: bool = True,
    generator: torch.Generator | None = None,
    unroll: int = 1,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Total loss and its parts (detached 0-d tensors, for logging) for one batch.

    `unroll` > 1 adds the loss of draft steps 2..unroll fed their own outputs (`unrolled_outputs`), each weighted
    like step 1; Gumiho's MLP heads then read step 2's output, as they do when drafting. Head drafters (Medusa,
    Hydra) read the target's features only, so `unroll` and `mlp_ce_on` do not apply to them.
    Nothing here waits for the device: the parts are read only when the trainer logs (`mean_parts`).
    `generator` must live on the batch's device."""
    feats = batch.features
    inputs = feats[:, :-1] + input_noise(feats[:, :-1].shape, noise, generator, feats.device)
    if isinstance(drafter, HeadDrafter):
        total, parts = _head_drafter_losses(drafter, batch, inputs, weights)
    else:
        total, parts = _feature_drafter_losses(drafter, batch, inputs, weights, mlp_ce_on, unroll)
    parts["loss"] = total.detach()
    return total, parts


def _head_drafter_losses(drafter: HeadDrafter, batch: Batch, inputs: torch.Tensor, weights: LossWeights):
    """Medusa's or Hydra's heads; head k's parts are named like a depth-(k + 1) draft step's (lv, lp, acc1 for head
    0; lv_step2, lp_step2, acc2 for head 1; ...)."""
    ids, mask, feats = batch.input_ids, batch.loss_mask, batch.features
    dev = feats.device
    total = torch.zeros((), device=dev)
    parts = {}
    for k in range(drafter.config.mlp_heads):
        width = feats.shape[1] - k - 2  # slots j whose token x_{j+k+2} exists
        if width < 1:
            break
        rows = _rows(mask[:, k + 2:], dev)
        following = torch.stack([ids[:, 1 + i: 1 + i + width] for i in range(k + 1)], -1)  # x_{j+1} .. x_{j+k+1}
        predicted = drafter.predict(_select(inputs[:, :width], rows), _select(following, rows), k)
        lv, lp, agree = _prediction_terms(drafter, predicted, _select(feats[:, k + 1: k + 1 + width], rows), True)
        total = total + weights.head_decay**k * (weights.head_feature * lv + weights.head_ce * lp)
        suffix = "" if k == 0 else f"_step{k + 1}"
        parts.update({f"lv{suffix}": lv.detach(), f"lp{suffix}": lp.detach(), f"acc{k + 1}": agree})
    return total, parts


def _feature_drafter_losses(drafter: Drafter, batch: Batch, inputs: torch.Tensor, weights: LossWeights,
                            mlp_ce_on: bool, unroll: int):
    """EAGLE's and Gumiho's Transformer (every unrolled step), and Gumiho's MLP heads."""
    ids, mask, feats = batch.input_ids, batch.loss_mask, batch.features
    b, t, hidden = feats.shape
    dev = feats.device
    outputs = unrolled_outputs(drafter, ids, inputs, unroll)
    h = outputs[0]

    total = torch.zeros((), device=dev)
    parts = {}
    for k, out in enumerate(outputs, start=1):
        counted = mask[:, k + 1:]  # h^k_j predicts x_{j+k+1}
        width, rows = counted.shape[1], _rows(counted, dev)
        lv, lp, agree = _prediction_terms(drafter, _select(out[:, :width], rows), _select(feats[:, k: k + width], rows),
                                          True)
        total = total + weights.feature * lv + weights.ce * lp
        suffix = "" if k == 1 else f"_step{k}"
        parts.update({f"lv{suffix}": lv.detach(), f"lp{suffix}": lp.detach(), f"acc{k}": agree})

    if isinstance(drafter, GumihoDrafter) and t >= 5:
        n, heads = t - 4, drafter.config.mlp_heads
        first = drafter.transformer.fuse(drafter.embed(ids[:, 2: 2 + n]), h[:, :n])
        serial2 = outputs[1][:, :n] if unroll > 1 else h[:, 1: 1 + n]  # drafting reads step 2's own output
        second = drafter.transformer.fuse(drafter.embed(ids[:, 3: 3 + n]), serial2)
        mask_pad = torch.cat([mask, mask.new_zeros(b, heads)], 1)
        feats_pad = torch.cat([feats, feats.new_zeros(b, heads, hidden)], 1)
        head_masks = torch.stack([mask_pad[:, 4 + i: 4 + i + n] for i in range(heads)])  # [heads, B, n], CPU
        rows = head_masks.any(0)
        if rows.any():
            predicted = drafter.heads(_select(torch.cat([first, second], -1), _rows(rows, dev)))  # [heads, R, H]
            for i, w in enumerate(head_weights(heads, weights.mlp_decay, weights.mlp_normaliser)):
                keep = _rows(head_masks[i][rows], dev)  # among the R rows
                target = _select(feats_pad[:, 3 + i: 3 + i + n], _rows(head_masks[i], dev))
                lv_i, lp_i, agree_i = _prediction_terms(drafter, predicted[i].index_select(0, keep), target,
                                                        mlp_ce_on)
                total = total + w * weights.mlp_feature * lv_i
                if mlp_ce_on:
                    total = total + w * weights.mlp_ce * lp_i
                parts[f"lv_mlp{i}"] = lv_i.detach()
                if mlp_ce_on:
                    parts[f"acc_mlp{i}"] = agree_i
    return total, parts


def mean_parts(window: list[dict[str, torch.Tensor]]) -> dict[str, float]:
    """Mean of each part over the steps that have it (keys of the last step), read from the device in one go."""
    keys = list(window[-1])
    means = torch.stack([torch.stack([p[k].float() for p in window if k in p]).mean() for k in keys])
    return dict(zip(keys, means.tolist()))
