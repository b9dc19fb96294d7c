"""A lean forward for Llama-family targets, gpt-fast style: the same weights and arithmetic as transformers'
`LlamaModel`, with far fewer Python layers per step and a pre-allocated KV cache.

Why: on a CPU a decode step of a 135M model is a few milliseconds of matrix work wrapped in ~10 ms of framework
code (cache objects, mask builders, hooks, per-projection modules). Here a layer is one fused QKV matmul, one
rotary op, one attention call, one output matmul and one fused gate-up matmul. The transformers model stays the
reference: tests check that this forward gives the same features and the same greedy tokens.

Attention groups query heads by the key/value head they share (GQA) and runs the group's rows as one batch,
so no key or value is ever repeated in memory.
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from types import ModuleType
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F
from transformers import PreTrainedModel

from . import int4 as int4_weights
from .errors import GumihoError
from .int4 import CastMatrix, Int4Matrix
from .kernels import prompt_attention, row_attention, row_ops
from .packed import PackedMatrix
from .tiles import TileMatrix, tiles_available, tiles_fit

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2")
PREFILL_ROWS = (64, 256)  # on the int4 path a prompt this long may take the float weights: the products are timed
# at these row counts (LeanLlama._fastest_prefill), and a prompt takes them from the crossing point on
PREFILL_DTYPES = (torch.float32, torch.bfloat16)  # the float weights' dtypes a long prompt's prefill may take
BF16_TILES = "bfloat16-tiles"  # and bf16 weights packed for AMX tiles (tiles.py), where the machine has them
PREFILL_REPEATS = 7  # timings of each candidate and row count behind the prefill choice
ROW_ATTENTION_TOKENS = 64  # the most tokens (a tree) given to the row-consistent attention; a prefill takes SDPA


@dataclass(frozen=True)
class CausalAttention:
    """How a prompt's causal attention is computed: in `dtype` (its inputs cast to it), and `way`: "kernel", the block
    kernel (kernels/prompt_attention.cpp); "amx", its bf16 products on AMX tiles; "sdpa", torch's SDPA. A way this
    machine lacks falls to the next one (`DecoderStack._runs_as`). The kernel's bf16 products are AVX512-BF16 dot
    products; SDPA's go through oneDNN, which takes AMX where the processor has it. 2-core Intel Xeon with AMX, 30
    layers at 763 tokens, casts included: kernel fp32 114 ms, kernel bf16 157, SDPA bf16 83; one layer alone, later:
    SDPA bf16 2.8 ms, the kernel's bf16 on the tiles 1.6."""

    dtype: torch.dtype
    way: str = "kernel"

    @property
    def name(self) -> str:
        return str(self.dtype).removeprefix("torch.") + ("" if self.way == "kernel" else f"-{self.way}")

    @staticmethod
    def named(name: object) -> CausalAttention | None:
        """The attention a choice file names (None: no such name)."""
        for attention in PROMPT_ATTENTIONS:
            if attention.name == name:
                return attention
        return None


# The causal attentions a long prompt may take (LeanLlama._fastest_causal_attention).
PROMPT_ATTENTIONS = (CausalAttention(torch.float32), CausalAttention(torch.bfloat16),
                     CausalAttention(torch.bfloat16, "sdpa"), CausalAttention(torch.bfloat16, "amx"))


TILE = 16  # keys per kept tile (kernels/attention.cpp, KeptTiles)


class StaticCache:
    """Keys and values of every layer in two pre-allocated tensors [layers, batch, kv_heads, capacity, head_dim].

    `length` slots are filled, the same number in every row (a batch of prompts is left-padded to one length, its
    pads masked). A forward writes its new tokens at [length, length + n) and advances `length`; `keep(prefix,
    nodes)` compacts a verified tree to its accepted path in place (one gather for all layers); `keep_rows` drops
    finished rows of a batch. The capacity doubles when needed.

    `tiles` (an fp16 cache read by the 512-bit row-consistent attention): 1, the keys also kept transposed in blocks
    of TILE, [layers, batch, kv_heads, capacity / TILE, head_dim * TILE]; 2, for the AMX tiles' attention, each block's
    key tiles and half of its block of 32's value tiles, in bf16 (twice as wide). The attention keeps the first
    `tiled[layer]` keys' tiles up to date (it converts each committed block once, where it had converted every block
    of a tree's call again). Whatever changes keys below that count lowers it: `truncate`, `crop`, `keep`.
    """

    def __init__(self, layers: int, kv_heads: int, head_dim: int, dtype: torch.dtype, device: torch.device,
                 capacity: int = 512, batch: int = 1, tiles: int = 0):
        self.keys = torch.empty(layers, batch, kv_heads, capacity, head_dim, dtype=dtype, device=device)
        self.values = torch.empty_like(self.keys)
        self.length = 0
        self.tile_width = int(tiles)
        self.tiles = self._new_tiles(capacity) if tiles else torch.empty(0, dtype=torch.float16)
        self.tiled = torch.zeros(layers, dtype=torch.long)

    def _new_tiles(self, capacity: int) -> torch.Tensor:
        layers, batch, kv_heads, _, head_dim = self.keys.shape
        return self.keys.new_empty(layers, batch, kv_heads, -(-capacity // TILE), head_dim * TILE * self.tile_width)

    def _forget_tiles(self, length: int) -> None:
        """Keys from `length` on may change: the tiles no longer vouch for them."""
        if self.tiles.numel():
            self.tiled.clamp_(max=length // TILE * TILE)

    def get_seq_length(self) -> int:
        return self.length

    @property
    def capacity(self) -> int:
        return self.keys.shape[3]

    def reserve(self, total: int) -> None:
        if total <= self.capacity:
            return
        capacity = max(total, 2 * self.capacity)
        for name in ("keys", "values"):
            old = getattr(self, name)
            new = old.new_empty(*old.shape[:3], capacity, old.shape[4])
            new[..., : self.length, :] = old[..., : self.length, :]
            setattr(self, name, new)
        if self.tiles.numel():
            tiles = self._new_tiles(capacity)
            tiles[:, :, :, : self.tiles.shape[3]] = self.tiles
            self.tiles = tiles

    def keep(self, prefix_len: int, nodes: torch.Tensor) -> None:
        """Keep the prefix and the entries of tree `nodes` (root first, in path order); drop the rest."""
        n = nodes.numel()
        if not bool((nodes == torch.arange(n, device=nodes.device)).all()):
            slots = nodes.to(self.keys.device) + prefix_len
            self.keys[..., prefix_len : prefix_len + n, :] = self.keys[..., slots, :]
            self.values[..., prefix_len : prefix_len + n, :] = self.values[..., slots, :]
            self._forget_tiles(prefix_len)
        self.length = prefix_len + n

    def keep_rows(self, rows: torch.Tensor) -> None:
        """Keep only the batch rows `rows`, in that order (a copy of the filled slots)."""
        self.keys = self.keys[:, rows, :, : self.length].contiguous()
        self.values = self.values[:, rows, :, : self.length].contiguous()
        if self.tiles.numel():
            self.tiles = self.tiles[:, rows, :, : -(-self.length // TILE)].contiguous()

    def truncate(self, length: int) -> None:
        """Keep the first `length` tokens (a draft's expansions never survive its call)."""
        self.length = min(self.length, length)
        self._forget_tiles(self.length)

    def crop(self, count: int) -> None:
        """Drop the last `count` tokens (a negative count, as transformers' `DynamicCache.crop` takes, works too)."""
        self.length -= abs(count)
        self._forget_tiles(self.length)


Matrix = PackedMatrix | Int4Matrix | CastMatrix | TileMatrix  # a callable x -> x @ W.T (+ bias)


def _stacked_bias(linears) -> torch.Tensor | None:
    """The projections' biases stacked as their weights are (zeros for one without), or None if none has one."""
    if all(lin.bias is None for lin in linears):
        return None
    return torch.cat([lin.bias.detach() if lin.bias is not None else lin.weight.new_zeros(lin.out_features)
                      for lin in linears])


@dataclass
class LayerWeights:
    """One decoder layer's weights for `DecoderStack`: the projections that read the same input stacked."""

    input_norm: torch.Tensor | None  # None: the layer reads its input as it is (a draft Transformer's layer 0)
    qkv: Matrix
    o: Matrix
    post_norm: torch.Tensor
    gate_up: Matrix
    down: Matrix


def float_matrix(dtype: torch.dtype) -> Callable[[torch.Tensor], Matrix]:
    """Products with a float weight in `dtype`, as the int4 path's long prompts take them: fp32 as it is, unpacked;
    another dtype a copy that the fp32 activations are cast to."""
    if dtype == torch.float32:
        return lambda weight: PackedMatrix(weight, pack=False)
    return lambda weight: CastMatrix(weight, dtype)


def prefill_choice(times: dict[torch.dtype | str | None, tuple[float, float]]) -> tuple[torch.dtype | str | None,
                                                                                      int]:
    """From the times of one layer's products at the two PREFILL_ROWS counts, per float weights (a dtype, or
    BF16_TILES) and for the 4-bit weights (key None): the weights fastest at the longer count and the prompt length
    from which they beat 4 bits, or (None, 0) where 4 bits stay the fastest."""
    short, long = PREFILL_ROWS
    best = min(times, key=lambda dtype: times[dtype][1])
    if best is None:
        return None, 0
    gain_short, gain_long = (times[None][i] - times[best][i] for i in (0, 1))
    if gain_short >= 0:
        return best, short
    return best, round(short + (long - short) * -gain_short / (gain_long - gain_short))


class DecoderStack:
    """Llama decoder layers run without modules over a `StaticCache`: the target's lean forward (LeanLlama) and,
    at inference, a draft Transformer's layers (drafters/base.py) share this loop."""

    def __init__(self, layers: list[LayerWeights], heads: int, kv_heads: int, head_dim: int, eps: float,
                 inv_freq: torch.Tensor, rope_scale: float, dtype: torch.dtype, device: torch.device):
        self.layers, self.heads, self.kv_heads, self.head_dim, self.eps = layers, heads, kv_heads, head_dim, eps
        self.group = heads // kv_heads
        self.inv_freq, self.rope_scale = inv_freq.float().to(device), rope_scale
        self.dtype, self.device = dtype, device
        self.kv_dtype = dtype  # what the cache stores (LeanLlama's int4 path: fp16)
        # A long prompt's weights (`prompt_layers`): on the int4 path, float ones where measured faster than 4 bits.
        self.prefill_layers: list[LayerWeights] | None = None
        self.prefill_dtype: torch.dtype | None = None  # theirs, where they are float (None: no such weights)
        self.prefill_tiles = False  # whether those (bf16) are packed for AMX tiles (tiles.py)
        self.prefill_from = 0
        self.prefill_attention: CausalAttention | None = None  # (None: the stack's dtype, the kernel where it builds)
        self._cos = self._sin = torch.empty(0)
        # Decode steps and tree verification take the row-consistent attention where it builds (kernels/): a tree
        # node then gets exactly a one-token step's output, so greedy speculation equals AR on a row-consistent path.
        consistent = device.type == "cpu" and dtype == torch.float32 and head_dim % 16 == 0
        self.row_attention = row_attention() if consistent else None
        self.row_ops = row_ops() if consistent else None  # the same rows' norms and gated product, one call each
        self.keeps_tiles = False  # whether its caches keep transposed keys (an fp16 cache: LeanLlama's int4 path)
        self.amx_rows = False  # whether decode steps and trees take bf16 products on AMX tiles (`attend`'s `amx`)
        # A prompt's fp32 causal attention in blocks (kernels/prompt_attention.cpp): 2.4-2.9x SDPA's speed on the
        # 2-core Zen 5 EPYC from 256 to 1,200 tokens; and with bf16 products where the processor has AVX512-BF16.
        self.prompt_kernel = prompt_attention() if device.type == "cpu" and head_dim % 64 == 0 else None

    def prompt_layers(self, n: int) -> tuple[list[LayerWeights], CausalAttention | None]:
        """The weights a prompt of n tokens goes through, and its causal attention (None: in the stack's dtype):
        from `prefill_from` tokens on, `prefill_layers` where set (else the stack's own) and `prefill_attention`."""
        if n < self.prefill_from:
            return self.layers, None
        return self.prefill_layers or self.layers, self.prefill_attention

    def new_cache(self, capacity: int = 512, batch: int = 1) -> StaticCache:
        return StaticCache(len(self.layers), self.kv_heads, self.head_dim, self.kv_dtype, self.device, capacity, batch,
                           tiles=2 if self.amx_rows else int(self.keeps_tiles))

    def _rms(self, x: torch.Tensor, weight: torch.Tensor | None, ops: ModuleType | None = None,
             bf16: bool = False) -> torch.Tensor:
        """RMS norm of x's rows; through `ops` where given, whose result may be rounded to bf16 (`bf16`)."""
        if weight is None:
            return x
        if ops is not None:
            return ops.rms_norm(x, weight, self.eps, bf16)
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return weight * h.to(x.dtype)

    def _add_rms(self, x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, ops: ModuleType | None,
                 bf16: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """The residual stream after a sublayer, and its norm (the next sublayer's input; in bf16 where `bf16`,
        through `ops`)."""
        if ops is not None:
            return ops.add_rms_norm(x, delta, weight, self.eps, bf16)
        x = x + delta
        return x, self._rms(x, weight)

    def _gated_product(self, gate_up: Matrix, h: torch.Tensor, ops: ModuleType | None) -> torch.Tensor:
        """The MLP's SiLU-gated product of h's rows: in the product's own pass where it computes it (a gated
        TileMatrix), else `gate_up`'s product through `_gated`."""
        if isinstance(gate_up, TileMatrix) and gate_up.gated:
            return gate_up.gated_product(h)
        return self._gated(gate_up(h), ops)

    @staticmethod
    def _gated(gate_up: torch.Tensor, ops: ModuleType | None) -> torch.Tensor:
        if ops is not None:
            return ops.silu_mul(gate_up)
        gate, up = gate_up.chunk(2, -1)
        return F.silu(gate) * up

    def row_kernels(self, n: int, prefill: bool) -> tuple[ModuleType | None, ModuleType | None]:
        """The row-consistent attention and per-row operations for a forward of n rows, where they apply. The
        attention: decode steps, trees and draft steps (a prompt takes its causal attention, `_causal`). The per-row
        operations: every forward, a prompt's too, whose rows they share out among the threads (2-core Zen 4 EPYC,
        an 800-token prefill's norms and gated products: 81 ms in torch's operations). Neither under autocast
        (bf16 self-distillation on a CPU with bf16 units), whose products return bf16 rows."""
        if self.row_attention is None or torch.is_autocast_enabled("cpu"):
            return None, None
        return (None if n > ROW_ATTENTION_TOKENS or prefill else self.row_attention), self.row_ops

    def _rope_tables(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        top = int(positions.max()) + 1
        if self._cos.shape[0] < top:
            size = max(top, 2 * self._cos.shape[0], 1024)
            freqs = torch.arange(size, device=self.device, dtype=torch.float32)[:, None] * self.inv_freq
            angles = torch.cat([freqs, freqs], -1)
            self._cos = (angles.cos() * self.rope_scale).to(self.dtype)
            self._sin = (angles.sin() * self.rope_scale).to(self.dtype)
        return self._cos[positions], self._sin[positions]

    def _attention(self, qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: StaticCache, i: int,
                   causal: bool, attn_mask: torch.Tensor | None,
                   causal_with: CausalAttention | None = None, out_dtype: torch.dtype | None = None) -> torch.Tensor:
        """Layer i's attention with torch's operations (SDPA; a prompt's, `_causal`): rotary, the cache writes,
        grouped query heads. A prompt takes its rotary and cache writes from the row kernel's `rotate` where it builds.
        `causal_with`: how a causal attention is computed, None: in the stack's dtype; `out_dtype`: the dtype it
        returns (None: the stack's)."""
        b, n = qkv.shape[:2]
        h, kvh, d, g = self.heads, self.kv_heads, self.head_dim, self.group
        past, total = cache.length, cache.length + n
        causal_with = causal_with or CausalAttention(self.dtype)
        if causal and self.row_attention is not None:  # rotary and cache writes in one call, the tokens shared out
            # queries in bf16 for a bf16 attention, rounded as it would round them
            q = self.row_attention.rotate(qkv, cos, sin, cache.keys[i], cache.values[i], h, past,
                                          causal_with.dtype == torch.bfloat16)
            keys, values = cache.keys[i, :, :, :total], cache.values[i, :, :, :total]
            return self._causal(q.view(b, h, n, d), keys, values, causal_with, out_dtype or self.dtype)
        qkv = qkv.view(b, n, h + 2 * kvh, d)
        qk = qkv[:, :, : h + kvh]
        cos, sin = cos[:, :, None], sin[:, :, None]  # one row per token, broadcast over heads
        qk = qk * cos + torch.cat([-qk[..., d // 2 :], qk[..., : d // 2]], -1) * sin
        q = qk[:, :, :h].reshape(b, n, kvh, g, d).permute(0, 2, 3, 1, 4).reshape(b, kvh, g * n, d)
        cache.keys[i, :, :, past:total] = qk[:, :, h:].transpose(1, 2)
        cache.values[i, :, :, past:total] = qkv[:, :, h + kvh :].transpose(1, 2)
        # Keys and values as the cache holds them (fp16 ones rounded, as a decode step reads them), in q's dtype.
        keys, values = cache.keys[i, :, :, :total], cache.values[i, :, :, :total]
        if causal:  # heads in their own order (KV head, group member): each reads KV head // group
            return self._causal(q.view(b, h, n, d), keys, values, causal_with, out_dtype or self.dtype)
        out = F.scaled_dot_product_attention(q, keys.to(self.dtype), values.to(self.dtype), attn_mask=attn_mask)
        return out.view(b, kvh, g, n, d).permute(0, 3, 1, 2, 4).reshape(b, n, h * d)

    def _runs_as(self, attention: CausalAttention) -> tuple[torch.dtype, str]:
        """What computes `attention` here: its dtype, and its way where this machine has it, else the next one's
        ("amx" needs the kernel built with AMX tiles that the OS grants, bf16 and heads of 64 dimensions; "kernel",
        the kernel built, with bf16 products for bf16; "sdpa" runs everywhere)."""
        kernel, dtype, way = self.prompt_kernel, attention.dtype, attention.way
        if way == "amx" and not (kernel is not None and dtype == torch.bfloat16 and self.head_dim == 64
                                 and kernel.amx_available()):
            way = "kernel"
        if way == "kernel" and not (kernel is not None and (dtype == torch.float32
                                                            or dtype == torch.bfloat16 and kernel.bf16_available())):
            way = "sdpa"
        return dtype, way

    def _causal(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, attention: CausalAttention,
                out_dtype: torch.dtype) -> torch.Tensor:
        """Causal attention [b, n, h * d] in `out_dtype` of a prompt's queries q [b, h, n, d] (heads ordered KV head,
        group member) over its keys and values [b, kv, n, d], computed as `attention` says (`_runs_as`): by the block
        kernel in fp32 or bf16, on AMX tiles or not, or by SDPA."""
        b, h, n, d = q.shape
        dtype, way = self._runs_as(attention)
        if way != "sdpa":  # bf16 products read bf16 queries and fp16 or bf16 keys and values as they are
            bf16 = dtype == torch.bfloat16
            q = q if bf16 and q.dtype == torch.bfloat16 else q.float()
            keys, values = (keys, values) if bf16 and keys.dtype in (torch.float16, torch.bfloat16) else (
                keys.float(), values.float())
            bf16_out = bf16 and out_dtype == torch.bfloat16  # rounded as `.to` rounds, without its pass
            return self.prompt_kernel.causal(q, keys, values, 0, d ** -0.5, bf16, way == "amx",
                                             bf16_out).to(out_dtype)
        out = F.scaled_dot_product_attention(q.to(dtype), keys.to(dtype), values.to(dtype), is_causal=True,
                                             enable_gqa=True).to(out_dtype)
        return out.transpose(1, 2).reshape(b, n, h * d)

    def run(self, x: torch.Tensor, positions: torch.Tensor, cache: StaticCache, mask: torch.Tensor | None = None,
            prefill: bool = False) -> torch.Tensor:
        """The layers' output [batch, n, hidden] (before any final norm) for inputs x [batch, n, hidden] at
        `positions` [batch, n]; their KV go to `cache` at [length, length + n). `mask` [batch, n, past + n] bool
        (True = attend) or None for causal; `prefill`: a prompt's tokens, which go through `prompt_layers`, and from
        an empty cache may take SDPA's causal attention, in the dtype `prompt_layers` names (the cache keeps its
        own, `kv_dtype`). A decode step or a tree never does, so that every verified row is computed as a one-token
        step would be."""
        b, n = x.shape[:2]
        layers, causal_with = self.prompt_layers(n) if prefill else (self.layers, None)
        past = cache.length
        cache.reserve(past + n)
        total = past + n
        cos, sin = self._rope_tables(positions)  # [b, n, d]
        # A prompt from an empty cache takes a causal attention, which skips the masked half (`_causal`: the block
        # kernel, else SDPA's own; SDPA at 800 tokens took 7.3 ms a layer against 10.6 with the mask on the 2-core
        # Zen 4 EPYC, the kernel 2.5 against SDPA's 5.9 on the 2-core Zen 5).
        causal = prefill and past == 0 and mask is None and n > 1
        if mask is None and n > 1 and not causal:
            mask = torch.ones(1, n, total, dtype=torch.bool, device=self.device).tril(past)
        rows_kernel, ops = self.row_kernels(n, prefill)
        # A prompt through bf16 weights hands its rows between the products and the per-row kernels in bf16: the
        # numbers the products' casts gave, without the casts' extra passes (2-core Intel Xeon with AMX, CNN/DM's
        # prompts of 763 tokens on average: the products with their casts 208 -> 134 ms, the prefill 318 -> 266).
        bf16 = ops is not None and layers is self.prefill_layers and self.prefill_dtype == torch.bfloat16
        visible = torch.empty(0, dtype=torch.bool) if mask is None else mask.expand(b, -1, -1)  # for rows_kernel
        # For SDPA: query rows ordered (group member, token) under each KV head, so the mask repeats per group
        # member; additive (0 / -inf) once here, since SDPA would convert a boolean mask in every layer (1-2 ms a
        # tree forward on a CPU) and gives the same result bit for bit.
        attn_mask = None
        if mask is not None and rows_kernel is None:
            attn_mask = torch.zeros(b, 1, self.group * n, total, dtype=self.dtype, device=self.device)
            attn_mask.masked_fill_(~mask.repeat(1, self.group, 1)[:, None], float("-inf"))
        for i, layer in enumerate(layers):
            qkv = layer.qkv(self._rms(x, layer.input_norm, ops, bf16))
            if rows_kernel is not None:  # rotary, cache writes and attention in one call
                out = rows_kernel.attend(qkv, cos, sin, cache.keys[i], cache.values[i], visible, self.heads, past,
                                         self.head_dim ** -0.5, cache.tiles, cache.tiled, i, self.amx_rows)
            else:
                out = self._attention(qkv, cos, sin, cache, i, causal, attn_mask, causal_with,
                                      torch.bfloat16 if bf16 else None)
            x, h = self._add_rms(x, layer.o(out), layer.post_norm, ops, bf16)
            x = x + layer.down(self._gated_product(layer.gate_up, h, ops))
        cache.length = total
        return x


def _read_choices(file: Path | None) -> dict:
    """The int4 path's choices remembered in `file` ({} where there is none, or it does not parse)."""
    try:
        saved = json.loads(file.read_text()) if file is not None else {}
    except (OSError, ValueError):
        return {}
    return saved if isinstance(saved, dict) else {}


def _write_choices(file: Path | None, choices: dict) -> None:
    if file is None:
        return
    try:
        file.parent.mkdir(parents=True, exist_ok=True)
        tmp = file.with_suffix(".tmp")
        tmp.write_text(json.dumps(choices) + "\n")
        tmp.replace(file)
    except OSError:
        pass  # a read-only cache: the next load measures again


class LeanLlama(DecoderStack):
    """The decoder stack of a transformers Llama-family model, run without its modules (weights shared or cast)."""

    def __init__(self, model: PreTrainedModel, pack: bool = True, int4: dict[str, np.ndarray] | None = None,
                 prefill_file: Path | None = None):
        """`pack`: oneDNN-packed fp32 / bf16 matmuls on CPU (see packed.py); ignored on other devices.

        `int4`: run every linear with 4-bit weights (int4.py), CPU only. The dict holds GGUF Q4_1 rows by module
        name ('model.layers.3.mlp.down_proj', see gguf_blocks.py), used as they are; a projection it lacks (or an
        empty dict: every one) is quantized from the model's float weights. `prefill_file`: where the int4 path's
        prefill choice is remembered for this machine and model (`_prefill_choice`); None: measured each time."""
        config = model.config
        self.pack, self.int4 = pack, int4
        if config.model_type not in SUPPORTED_MODEL_TYPES:
            raise GumihoError(f"the lean forward does not support model type {config.model_type!r}")
        if getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True) \
                and config.model_type == "mistral":
            raise GumihoError("the lean forward does not support sliding-window attention")
        decoder = model.model
        heads = config.num_attention_heads
        self.embed = decoder.embed_tokens.weight
        self.norm = decoder.norm.weight
        rotary = decoder.rotary_emb
        with torch.inference_mode(False):  # the fused weights must stay usable outside inference mode
            def layers(matrix: Callable[..., Matrix]) -> list[LayerWeights]:
                return [self._layer(f"model.layers.{i}", layer, matrix) for i, layer in enumerate(decoder.layers)]

            super().__init__(layers(self._fused), heads, config.num_key_value_heads,
                             getattr(config, "head_dim", None) or config.hidden_size // heads, config.rms_norm_eps,
                             rotary.inv_freq, float(getattr(rotary, "attention_scaling", 1.0)), self.embed.dtype,
                             self.embed.device)
            # The int4 path's cache in fp16 where the row-consistent attention reads it: half the bytes a step
            # streams (46 KB a cached token in fp32 for the default model), keys within 4e-4 of their fp32 values.
            if int4 is not None and self.row_attention is not None:
                self.kv_dtype = torch.float16
                # whose keys its 512-bit build also keeps transposed (StaticCache.tiles)
                self.keeps_tiles = self.row_attention.keeps_tiles() and self.head_dim in (64, 128)
                # and whose rows may take bf16 products on AMX tiles, where measured faster (other numbers)
                if self.row_attention.amx() and self.head_dim == 64 and self.group <= 16:
                    self.amx_rows = self._row_attention_choice(prefill_file)
            # A long prompt on the int4 path: the float weights in the dtype measured fastest, if any beats 4 bits,
            # and its causal attention in the dtype measured fastest.
            if int4 is not None:
                weights, self.prefill_from, self.prefill_attention = self._prefill_choice(decoder.layers[0],
                                                                                          prefill_file)
                self.prefill_tiles = weights == BF16_TILES and tiles_available()
                self.prefill_dtype = torch.bfloat16 if weights == BF16_TILES else weights
                if self.fetches:
                    int4_weights.AHEAD, int4_weights.KEEP = self.fastest_fetch()[0]
                if weights is not None:
                    self.prefill_layers = layers(partial(self._float_for_prefill, weights))

    def _fused(self, names: list[str], *linears) -> Matrix:
        """One matrix for several projections that read the same input: 4-bit on the int4 path, else float."""
        if self.int4 is not None:
            return self._int4(names, linears)
        return self._float(linears, self.pack)

    def _float_for_prefill(self, weights: torch.dtype | str, names: list[str],
                           *linears) -> PackedMatrix | CastMatrix | TileMatrix:
        """The int4 path's prefill matrices: the model's float weights, multiplied unpacked; fp32 as they are
        (views, no copy), another dtype as a copy that the fp32 activations are cast to; BF16_TILES, bf16 packed for
        AMX tiles (the MLP's gate and up projections as one gated product), a shape the tiles do not take in bf16."""
        if weights == torch.float32:
            return self._float(linears, pack=False)
        weight = torch.cat([lin.weight.detach() for lin in linears])
        gated = names[-1].endswith("mlp.up_proj")
        if weights == BF16_TILES and tiles_available() and tiles_fit(weight):
            return TileMatrix(weight, _stacked_bias(linears), gated)
        return CastMatrix(weight, torch.bfloat16 if weights == BF16_TILES else weights, _stacked_bias(linears))

    @staticmethod
    def _float(linears, pack: bool) -> PackedMatrix:
        """The projections' float weights stacked. The projections' weights become views into the stack, so the
        transformers model keeps working and no weight is stored twice."""
        if len(linears) == 1:
            lin = linears[0]
            return PackedMatrix(lin.weight.detach(), None if lin.bias is None else lin.bias.detach(), pack)
        weight = torch.cat([lin.weight.detach() for lin in linears])
        bias = _stacked_bias(linears)
        start = 0
        for lin in linears:
            rows = slice(start, start + lin.out_features)
            lin.weight.data = weight[rows]
            if lin.bias is not None:
                lin.bias.data = bias[rows]
            start += lin.out_features
        return PackedMatrix(weight, bias, pack)

    def _int4(self, names: list[str], linears) -> Int4Matrix:
        """The projections stacked (rows) as one 4-bit matrix: from the GGUF blocks when all of them are there."""
        bias = _stacked_bias(linears)
        if all(name in self.int4 for name in names):
            return Int4Matrix.from_q4_1(np.concatenate([self.int4[name] for name in names]), bias)
        return Int4Matrix.quantize(torch.cat([lin.weight.detach() for lin in linears]), bias)

    def _layer(self, prefix: str, layer, matrix: Callable[..., Matrix]) -> LayerWeights:
        """The layer's weights; `matrix(names, *linears)` stacks projections that read the same input."""

        def fused(*modules: str) -> Matrix:
            return matrix([f"{prefix}.{m}" for m in modules], *(layer.get_submodule(m) for m in modules))

        return LayerWeights(
            input_norm=layer.input_layernorm.weight.detach(),
            qkv=fused("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
            o=fused("self_attn.o_proj"),
            post_norm=layer.post_attention_layernorm.weight.detach(),
            gate_up=fused("mlp.gate_proj", "mlp.up_proj"),
            down=fused("mlp.down_proj"),
        )

    @property
    def fetches(self) -> bool:
        """Whether the products are our 4-bit kernel's, which asks for its weights ahead (int4.AHEAD and KEEP)."""
        return self.int4 is not None and self.layers[0].o.kernel is not None

    def fastest_fetch(self) -> tuple[int4_weights.FetchSetting, dict[int4_weights.FetchSetting, float]]:
        """`int4.fastest_fetch` over one row through every layer's 4-bit products (a decode step's weights),
        measured at every load: it takes about 0.4 s and changes no number, and the best setting is the host's as
        much as the processor's (on a 2-core AMD EPYC Zen 5 of the same signature, 8 and 16 KB tied one
        day, 2.08 ms each; another day 16 KB took 1.50 ms against 1.69 at 8 KB)."""
        hidden, inner = self.embed.shape[1], self.layers[0].down.in_features
        x, y = torch.randn(1, hidden), torch.randn(1, inner)

        def step() -> None:
            for layer in self.layers:
                layer.qkv(x), layer.o(x), layer.gate_up(x), layer.down(y)

        with torch.inference_mode():
            return int4_weights.fastest_fetch(step)

    def _prefill_choice(self, first: torch.nn.Module, file: Path | None) -> tuple[torch.dtype | str | None, int,
                                                                                   CausalAttention]:
        """`_fastest_prefill`, measured once per machine and model and then read from `file`: the weights (a float
        dtype, BF16_TILES, or None: the 4-bit ones), from how many tokens, and the causal attention. The choice
        changes the prompt's numerics, and so the greedy text of every prompt past the crossing: measured afresh at each
        load, it flipped between processes on the Zen 4 (the two times are close near 256 rows), and the same
        drafter's tau on MT-Bench's first 20 prompts read 2.705 in one process and 2.367 in another."""
        names = {None: "int4", **{dtype: str(dtype).removeprefix("torch.") for dtype in PREFILL_DTYPES},
                 BF16_TILES: BF16_TILES}
        saved = _read_choices(file)
        by_name = {name: dtype for dtype, name in names.items()}
        attention = CausalAttention.named(saved.get("attention"))
        try:
            if saved.get("dtype") in by_name and int(saved.get("from", -1)) >= 0 and attention is not None:
                return by_name[saved["dtype"]], int(saved["from"]), attention
        except (ValueError, TypeError):
            pass  # a damaged or older file: measure and write it again
        dtype, start, attention = self._fastest_prefill(first)
        _write_choices(file, {**saved, "dtype": names[dtype], "from": start, "attention": attention.name})
        return dtype, start, attention

    def _row_attention_choice(self, file: Path | None) -> bool:
        """Whether decode steps and trees take bf16 products on AMX tiles (`_amx_rows_pay`), measured once per
        machine and model and then read from `file` ("rows": "float32" or "bfloat16-amx"): like the prefill's
        choice, it sets the numbers of every greedy text, which must not flip between processes."""
        names = {False: "float32", True: "bfloat16-amx"}
        saved = _read_choices(file)
        if saved.get("rows") in names.values():
            return saved["rows"] == names[True]
        amx = self._amx_rows_pay()
        _write_choices(file, {**saved, "rows": names[amx]})
        return amx

    def _amx_rows_pay(self, past: int = 640, tokens: tuple[int, ...] = (1, 4)) -> bool:
        """Whether the AMX tiles' attention (`attend(..., amx=True)`, a cache keeping its tiles) takes less time than
        the fp32 one (keeping its own) over every layer, for a decode step and a tree of 4 tokens over `past` cached
        tokens (the sum of their medians of PREFILL_REPEATS, the two taking turns). On the 2-core Intel Xeon with AMX
        (model 167), 30 layers over 800 cached tokens, 1 / 2 / 4 / 8 new tokens: 1.74 / 2.23 / 2.89 / 4.38 ms in
        fp32, 1.35 / 1.32 / 1.54 / 2.30 on the tiles."""
        generator = torch.Generator().manual_seed(0)
        width = (self.heads + 2 * self.kv_heads) * self.head_dim
        caches = {}
        for amx in (False, True):
            cache = StaticCache(len(self.layers), self.kv_heads, self.head_dim, self.kv_dtype, self.device,
                                past + max(tokens), tiles=2 if amx else int(self.keeps_tiles))
            cache.keys.copy_(torch.randn(cache.keys.shape, generator=generator))
            cache.values.copy_(torch.randn(cache.values.shape, generator=generator))
            caches[amx] = cache
        inputs = {n: (torch.randn(1, n, width, generator=generator),
                      *self._rope_tables(torch.arange(past, past + n)[None]),
                      torch.ones(1, n, past + n, dtype=torch.bool).tril(past)) for n in tokens}

        def seconds(amx: bool, n: int) -> float:
            cache, (qkv, cos, sin, visible) = caches[amx], inputs[n]
            start = time.perf_counter()
            for i in range(len(self.layers)):
                self.row_attention.attend(qkv, cos, sin, cache.keys[i], cache.values[i], visible, self.heads, past,
                                          self.head_dim ** -0.5, cache.tiles, cache.tiled, i, amx)
            return time.perf_counter() - start

        samples = {(amx, n): [] for amx in (False, True) for n in tokens}
        with torch.inference_mode():
            for repeat in range(PREFILL_REPEATS + 1):
                for (amx, n), taken in samples.items():
                    elapsed = seconds(amx, n)
                    if repeat:  # the first calls build the kept tiles
                        taken.append(elapsed)
        cost = {amx: sum(statistics.median(samples[(amx, n)]) for n in tokens) for amx in (False, True)}
        return cost[True] < cost[False]

    def _fastest_prefill(self, first: torch.nn.Module) -> tuple[torch.dtype | str | None, int, CausalAttention]:
        """The float weights (a dtype of PREFILL_DTYPES, or BF16_TILES where the machine has AMX tiles) whose
        products, one layer's with its gated product, are the fastest over the longer of PREFILL_ROWS rows, and from
        how many rows they beat the 4-bit ones (where the two times, taken as linear in the rows, cross; at least
        the shorter count); (None, 0) where none beats 4 bits (medians of PREFILL_REPEATS); and the dtype of the
        prompt's causal attention (`_fastest_causal_attention`). Each candidate reads rows in the dtype a prefill
        hands it (bf16 weights bf16 rows).
        On the 2-core Zen 4 EPYC the 8-bit-activation kernel beats bf16 at 64 rows (58.6 against 72.5 ms for a
        whole prefill) and loses at 256 (314 against 227) and 800 (1,142 against 889): the crossing is near 90
        rows. On the AVX2 EPYC, with torch's kernel, fp32 took half the 4-bit time at 64 rows. The candidates take
        turns within each repeat, so that a slow spell of the host cannot decide alone: timed one after another, the
        first load on the 2-core Intel Xeon with AMX chose 4 bits at every length, where bf16 measured 2.1 ms
        against 5.1 at 256 rows afterwards (the cause not known)."""
        hidden = self.embed.shape[1]
        inputs = {rows: torch.randn(rows, hidden) for rows in PREFILL_ROWS}
        inputs_bf16 = {rows: x.to(torch.bfloat16) for rows, x in inputs.items()}
        _, ops = self.row_kernels(PREFILL_ROWS[1], prefill=True)

        def seconds(layer: LayerWeights, rows: int, weights: torch.dtype | str | None) -> float:
            x = (inputs_bf16 if weights in (torch.bfloat16, BF16_TILES) else inputs)[rows]
            start = time.perf_counter()
            layer.qkv(x), layer.o(x), layer.down(self._gated_product(layer.gate_up, x, ops))
            return time.perf_counter() - start

        candidates: dict[torch.dtype | str | None, LayerWeights] = {None: self.layers[0]}
        for weights in PREFILL_DTYPES + ((BF16_TILES,) if tiles_available() else ()):
            candidates[weights] = self._layer("model.layers.0", first, partial(self._float_for_prefill, weights))
        samples = {(weights, rows): [] for weights in candidates for rows in PREFILL_ROWS}
        with torch.inference_mode():
            for weights, rows in samples:  # first calls pay one-time costs (oneDNN makes a kernel per shape)
                seconds(candidates[weights], rows, weights)
            for _ in range(PREFILL_REPEATS):  # interleaved, so that a slow spell of the host hits every candidate
                for (weights, rows), taken in samples.items():
                    taken.append(seconds(candidates[weights], rows, weights))
            times = {weights: tuple(statistics.median(samples[(weights, rows)]) for rows in PREFILL_ROWS)
                     for weights in candidates}
            weights, start = prefill_choice(times)
            return weights, start, self._fastest_causal_attention()

    def _fastest_causal_attention(self) -> CausalAttention:
        """The causal attention (of PROMPT_ATTENTIONS, those that differ on this machine) that is the fastest for one
        layer over the longer of PREFILL_ROWS tokens, casts included (medians of PREFILL_REPEATS, the candidates taking
        turns). On an earlier Intel Xeon with AMX, 30 layers at 769 tokens: fp32 158 ms, bf16 (SDPA) 79. On the 2-core
        Zen 4 EPYC, the block kernel's fp32 against its bf16 products at 800 / 1,200 tokens: 144 / 303 ms against
        93 / 216."""
        rows = PREFILL_ROWS[1]
        q = torch.randn(1, self.heads, rows, self.head_dim)
        keys, values = (torch.randn(1, self.kv_heads, rows, self.head_dim) for _ in range(2))
        # one candidate per way of computing (where the kernel is not built, the first named of those SDPA runs)
        candidates = {self._runs_as(attention): attention for attention in reversed(PROMPT_ATTENTIONS)}
        samples: dict[CausalAttention, list[float]] = {attention: [] for attention in candidates.values()}
        for repeat in range(PREFILL_REPEATS + 1):
            for attention, taken in samples.items():
                start = time.perf_counter()
                self._causal(q, keys, values, attention, self.dtype)
                if repeat:  # the first calls pay one-time costs
                    taken.append(time.perf_counter() - start)
        return min(PROMPT_ATTENTIONS, key=lambda a: statistics.median(samples[a]) if a in samples else float("inf"))

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, cache: StaticCache,
                mask: torch.Tensor | None = None, prefill: bool = False) -> torch.Tensor:
        """Post-norm last-layer features [n, hidden] for `tokens` [n] at `positions` [n]; their KV go to `cache`.

        `mask` [n, past + n] bool (True = attend) for a tree; None means causal. A batch of sequences (one cache
        row each) passes tokens and positions [batch, n], a mask [batch, n, past + n] or None, and gets
        [batch, n, hidden]. `prefill`: a prompt's tokens, which on the int4 path (from `prefill_from` of them, where
        measured faster) go through the float weights, their causal attention in `prefill_attention` (`run`).
        """
        if tokens.dim() == 1:
            return self.forward(tokens[None], positions[None], cache, None if mask is None else mask[None],
                                prefill)[0]
        x = self.run(F.embedding(tokens, self.embed), positions, cache, mask, prefill)
        return self._rms(x, self.norm, self.row_kernels(tokens.shape[1], prefill)[1])
