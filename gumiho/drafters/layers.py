"""The feature-level draft Transformer shared by EAGLE-2 (1 layer) and Gumiho (2 layers).

u_j = fc([embed(x_{j+1}) ; f_j]) fuses a token with the feature before it; Llama decoder layers (layer 0 without
its input norm) turn u into h_j, the draft's prediction of the target feature f_{j+1}. Written here rather than
borrowed from transformers so that the draft KV cache and the tree masks stay fully under the drafter's control.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from ..int4 import Int4Stack
from ..llama import DecoderStack, LayerWeights, Matrix
from .config import DrafterConfig
from .heads import int4_blocks, linear_bias, residual_blocks


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rope(positions: torch.Tensor, d: int, theta: float, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Llama rotary cos and sin for `positions` [T] or [B, T], shaped to broadcast over [B, heads, T, d]; computed
    once per forward and shared by every layer's queries and keys."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, d, 2, device=positions.device, dtype=torch.float32) / d))
    angles = positions.float()[..., None] * inv_freq
    angles = torch.cat([angles, angles], -1)
    if angles.dim() == 3:
        angles = angles[:, None]
    return angles.cos().to(dtype), angles.sin().to(dtype)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Llama rotary embedding. x: [B, heads, T, d]."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], -1)
    return x * cos + rotated * sin


class KVCache:
    """Per-layer keys and values of the draft, [1, kv_heads, T, d] each."""

    def __init__(self, layers: int):
        self.keys: list[torch.Tensor | None] = [None] * layers
        self.values: list[torch.Tensor | None] = [None] * layers

    @property
    def length(self) -> int:
        return 0 if self.keys[0] is None else self.keys[0].shape[2]

    def append(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.keys[layer] is not None:
            k = torch.cat([self.keys[layer], k], 2)
            v = torch.cat([self.values[layer], v], 2)
        self.keys[layer], self.values[layer] = k, v
        return k, v

    def truncate(self, length: int) -> None:
        for i, k in enumerate(self.keys):
            if k is not None:
                self.keys[i] = k[:, :, :length]
                self.values[i] = self.values[i][:, :, :length]


class Attention(nn.Module):
    def __init__(self, config: DrafterConfig):
        super().__init__()
        hidden, self.heads, self.kv_heads = config.hidden_size, config.num_attention_heads, config.num_key_value_heads
        self.head_dim, self.theta = hidden // self.heads, config.rope_theta
        self.q_proj = nn.Linear(hidden, self.heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(hidden, self.kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(hidden, self.kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.heads * self.head_dim, hidden, bias=False)

    def forward(self, x, cos_sin, mask, cache: KVCache | None, layer: int) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        q = q.reshape(b, t, self.heads, self.head_dim).transpose(1, 2)
        k = k.reshape(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        v = v.reshape(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = rotate(q, *cos_sin), rotate(k, *cos_sin)
        if cache is not None:
            k, v = cache.append(layer, k, v)
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=mask is None, enable_gqa=self.heads != self.kv_heads
        )
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1))


class DecoderLayer(nn.Module):
    def __init__(self, config: DrafterConfig, index: int):
        super().__init__()
        hidden, intermediate, eps = config.hidden_size, config.intermediate_size, config.rms_norm_eps
        # Layer 0 reads the fc output directly: no input norm (EAGLE and Gumiho alike).
        self.input_layernorm = RMSNorm(hidden, eps) if index > 0 else None
        self.self_attn = Attention(config)
        self.post_attention_layernorm = RMSNorm(hidden, eps)
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)
        self.index = index

    def forward(self, x, cos_sin, mask, cache: KVCache | None) -> torch.Tensor:
        h = self.input_layernorm(x) if self.input_layernorm is not None else x
        x = x + self.self_attn(h, cos_sin, mask, cache, self.index)
        h = self.post_attention_layernorm(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


class DraftTransformer(nn.Module):
    """fc fusion + `config.num_layers` decoder layers."""

    def __init__(self, config: DrafterConfig):
        super().__init__()
        self.fc = nn.Linear(2 * config.hidden_size, config.hidden_size, bias=True)
        self.layers = nn.ModuleList(DecoderLayer(config, i) for i in range(config.num_layers))

    def fuse(self, token_embeddings: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.cat([token_embeddings, features], -1))

    def forward(
        self,
        fused: torch.Tensor,
        positions: torch.Tensor,
        mask: torch.Tensor | None = None,
        cache: KVCache | None = None,
    ) -> torch.Tensor:
        """fused: [B, T, H]. mask: bool [B or 1, 1, T, past+T] (True = attend) or None for causal without past."""
        x = fused
        attn = self.layers[0].self_attn
        cos_sin = rope(positions, attn.head_dim, attn.theta, fused.dtype)
        for layer in self.layers:
            x = layer(x, cos_sin, mask, cache)
        return x


MakeMatrix = Callable[[torch.Tensor], Matrix]  # a weight -> its products (4-bit, packed or cast)


def lean_layers(transformer: DraftTransformer, matrix: MakeMatrix) -> list[LayerWeights]:
    """The draft layers' weights as llama.DecoderStack reads them: q, k and v one product, gate and up one product,
    each made by `matrix(stacked weight)`."""

    def weights(layer: DecoderLayer) -> LayerWeights:
        attn = layer.self_attn
        return LayerWeights(
            input_norm=None if layer.input_layernorm is None else layer.input_layernorm.weight.detach(),
            qkv=matrix(torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight]).detach()),
            o=matrix(attn.o_proj.weight.detach()),
            post_norm=layer.post_attention_layernorm.weight.detach(),
            gate_up=matrix(torch.cat([layer.gate_proj.weight, layer.up_proj.weight]).detach()),
            down=matrix(layer.down_proj.weight.detach()),
        )

    return [weights(layer) for layer in transformer.layers]


def lean_stack(transformer: DraftTransformer, config: DrafterConfig, matrix: MakeMatrix) -> DecoderStack:
    """The draft layers for inference as the target's lean forward runs its own (llama.DecoderStack): `lean_layers`
    (`matrix`: 4-bit on the int4 path, else float), a pre-allocated KV cache, and the row-consistent attention for
    the few rows of a draft step. On a CPU a draft step's products are small and what surrounds them (module calls,
    a cache grown by concatenation, SDPA with a boolean mask) cost more than they do. The modules stay for
    training; the files are unchanged."""
    attn, weight = transformer.layers[0].self_attn, transformer.fc.weight
    inv_freq = 1.0 / (attn.theta ** (torch.arange(0, attn.head_dim, 2, dtype=torch.float32) / attn.head_dim))
    return DecoderStack(lean_layers(transformer, matrix), attn.heads, attn.kv_heads, attn.head_dim,
                        config.rms_norm_eps, inv_freq, 1.0, weight.dtype, weight.device)


class ParallelHeads(nn.Module):
    """Gumiho's MLP heads, stored stacked so all of them run in one batched call.

    Head m: a_0 = SiLU(W_0 u + b_0) with u in R^{2H}, then `config.mlp_blocks` residual blocks
    a_k = a_{k-1} + SiLU(W_k a_{k-1} + b_k).
    Weights start at zero; biases keep nn.Linear's default initialisation.
    """

    def __init__(self, config: DrafterConfig):
        super().__init__()
        hidden, heads, blocks = config.hidden_size, config.mlp_heads, config.mlp_blocks
        self.in_weight = nn.Parameter(torch.zeros(heads, 2 * hidden, hidden))
        self.in_bias = nn.Parameter(linear_bias(heads, 2 * hidden, hidden))
        self.block_weight = nn.Parameter(torch.zeros(heads, blocks, hidden, hidden))
        self.block_bias = nn.Parameter(torch.stack([linear_bias(blocks, hidden, hidden) for _ in range(heads)]))
        self.int4: tuple[Int4Stack, list[Int4Stack]] | None = None  # set by to_int4

    def to_int4(self) -> None:
        """For an inference copy on the int4 path: every product in 4 bits; the float weights are no longer read."""
        self.int4 = Int4Stack(self.in_weight, self.in_bias), int4_blocks(self.block_weight, self.block_bias)

    def forward(self, u: torch.Tensor, heads: int | None = None) -> torch.Tensor:
        """u: [R, 2H] -> [heads, R, H], from the first `heads` heads (default: all)."""
        n = heads or self.in_weight.shape[0]
        first = slice(0, n)
        if self.int4 is None:
            a = F.silu(torch.baddbmm(self.in_bias[:n, None], u.expand(n, -1, -1), self.in_weight[:n]))
            return residual_blocks(a, self.block_weight, self.block_bias, first)
        a = F.silu(self.int4[0](u.expand(n, -1, -1), first))
        return residual_blocks(a, self.block_weight, self.block_bias, first, self.int4[1])
