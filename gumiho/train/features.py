"""Target features on disk: one safetensors shard per group of conversations, fp16, written atomically.

A shard holds the concatenated `input_ids`, `loss_mask` and post-norm last-layer `features` [N, H] of its
conversations plus `offsets` [n + 1]. A shard that exists is complete, which is what makes extraction resumable.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from ..errors import GumihoError
from ..target import Target
from .data import Rendered

log = logging.getLogger(__name__)


@dataclass
class Sequence:
    """One conversation with its target features."""

    input_ids: torch.Tensor  # [T] int64
    loss_mask: torch.Tensor  # [T] bool
    features: torch.Tensor  # [T, H] fp16


@torch.inference_mode()
def target_features(target: Target, rendered: list[Rendered], batch_tokens: int = 4096) -> list[torch.Tensor]:
    """Post-norm last-layer features [T, H] (fp16, CPU) of each sequence, computed in right-padded batches; on the
    int4 path one sequence at a time through the engine's own forward (its kernels take no padding), so that a
    drafter trained on them sees the features it will be given at inference there."""
    if target.int4:
        return [target.features(torch.tensor(r.input_ids, device=target.device), target.new_cache(), prefill=True)
                .to("cpu", torch.float16) for r in rendered]
    order = sorted(range(len(rendered)), key=lambda i: len(rendered[i].input_ids))
    out: list[torch.Tensor | None] = [None] * len(rendered)
    start = 0
    while start < len(order):
        end = start + 1
        while end < len(order) and len(rendered[order[end]].input_ids) * (end - start + 1) <= batch_tokens:
            end += 1
        batch = [rendered[i].input_ids for i in order[start:end]]
        width = max(len(ids) for ids in batch)
        ids = torch.tensor([row + [0] * (width - len(row)) for row in batch], device=target.device)
        attention = torch.tensor([[1] * len(row) + [0] * (width - len(row)) for row in batch], device=target.device)
        hidden = target.model.model(input_ids=ids, attention_mask=attention).last_hidden_state
        for row, i in enumerate(order[start:end]):
            out[i] = hidden[row, : len(rendered[i].input_ids)].to("cpu", torch.float16)
        start = end
    return out  # type: ignore[return-value]


def write_shard(path: Path, rendered: list[Rendered], features: list[torch.Tensor]) -> None:
    lengths = [len(r.input_ids) for r in rendered]
    offsets = torch.tensor([0] + lengths).cumsum(0)
    tensors = {
        "input_ids": torch.tensor([t for r in rendered for t in r.input_ids], dtype=torch.int32),
        "loss_mask": torch.tensor([m for r in rendered for m in r.loss_mask], dtype=torch.uint8),
        "features": torch.cat(features).contiguous() if features else torch.zeros(0, 1, dtype=torch.float16),
        "offsets": offsets,
    }
    tmp = path.with_suffix(".tmp")
    save_file(tensors, str(tmp), metadata={"ids": json.dumps([r.id for r in rendered])})
    tmp.replace(path)


def read_rendered(path: Path) -> list[Rendered]:
    """A shard's conversations without their features: what `target_features` needs to compute them again."""
    with safe_open(str(path), framework="pt") as f:
        ids, mask = f.get_tensor("input_ids").tolist(), f.get_tensor("loss_mask").tolist()
        offsets, names = f.get_tensor("offsets").tolist(), json.loads(f.metadata()["ids"])
    return [Rendered(name, ids[a:b], mask[a:b]) for name, a, b in zip(names, offsets[:-1], offsets[1:])]


def read_shard(path: Path) -> list[Sequence]:
    with safe_open(str(path), framework="pt") as f:
        ids, mask = f.get_tensor("input_ids").long(), f.get_tensor("loss_mask").bool()
        features, offsets = f.get_tensor("features"), f.get_tensor("offsets").tolist()
    return [Sequence(ids[a:b], mask[a:b], features[a:b]) for a, b in zip(offsets[:-1], offsets[1:])]


def shard_summary(path: Path) -> dict:
    """What identifies a shard's data without its features: the sequences' ids, the token and reply-token counts,
    and sha256 digests of the token ids and of the loss mask. Small enough to commit; a rerun of the same recipe
    must give the same digests (the features differ in the last bits between machines, the tokens must not)."""
    with safe_open(str(path), framework="pt") as f:
        ids, mask = f.get_tensor("input_ids"), f.get_tensor("loss_mask")
        names = json.loads(f.metadata()["ids"])
    return {"sequences": names, "tokens": ids.numel(), "reply_tokens": int(mask.sum()),
            "input_ids_sha256": hashlib.sha256(ids.numpy().tobytes()).hexdigest(),
            "loss_mask_sha256": hashlib.sha256(mask.numpy().tobytes()).hexdigest()}


def shard_paths(folder: str | Path) -> list[Path]:
    """A prepared folder's feature shards in order; an error naming the folder when it holds none."""
    shards = sorted(Path(folder).glob("shard-*.safetensors"))
    if not shards:
        raise GumihoError(f"{folder} holds no feature shards; run `python -m gumiho.train prepare` first")
    return shards


def load_sequences(folder: str | Path) -> list[Sequence]:
    shards = shard_paths(folder)
    sequences = []
    for shard in shards:
        try:
            sequences += read_shard(shard)
        except Exception as exc:  # safetensors raises its own error type for a damaged file
            log.warning("skipping the unreadable shard %s (%s)", shard, str(exc).splitlines()[0] if str(exc) else
                        type(exc).__name__)
    if not sequences:
        raise GumihoError(f"{folder}: no readable feature shard")
    return sequences
