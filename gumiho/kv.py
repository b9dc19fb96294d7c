"""Target KV-cache bookkeeping: after verification, keep only the accepted path's entries."""

from __future__ import annotations

import torch
from transformers import DynamicCache

from .llama import StaticCache


@torch.inference_mode()
def keep_accepted(cache: StaticCache | DynamicCache, prefix_len: int, nodes: torch.Tensor) -> None:
    """Keep the prefix and the KV of tree `nodes` (root first, in path order); drop everything else the tree wrote."""
    if isinstance(cache, StaticCache):
        cache.keep(prefix_len, nodes)
        return
    n = nodes.numel()
    is_chain = bool((nodes == torch.arange(n, device=nodes.device)).all())
    for layer in cache.layers:
        if not is_chain:
            slots = nodes.to(layer.keys.device) + prefix_len
            layer.keys[..., prefix_len : prefix_len + n, :] = layer.keys[..., slots, :]
            layer.values[..., prefix_len : prefix_len + n, :] = layer.values[..., slots, :]
        layer.keys = layer.keys[..., : prefix_len + n, :]
        layer.values = layer.values[..., : prefix_len + n, :]
