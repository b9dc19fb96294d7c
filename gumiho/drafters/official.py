"""The papers' own checkpoint layouts and our drafter's state dict, in both directions.

Gumiho (amd/Gumiho-*) and EAGLE / EAGLE-2 (yuhuili/EAGLE-*) store the drafter as a flat state dict whose names
follow the official modules (`gumiho/model/cnets.py`, `eagle/model/cnets1.py`):

    embed_tokens.weight                      [V, h]   frozen copy of the target's embedding (checked, never used)
    fc.weight, fc.bias                       [h, 2h], [h]   input cat(embedding, feature); EAGLE "bias": false: no bias
    layers.{l}.self_attn.{q,k,v,o}_proj.weight
    layers.{l}.mlp.{gate,up,down}_proj.weight
    layers.{l}.input_layernorm.weight        only for l >= 1
    layers.{l}.post_attention_layernorm.weight
    mlp.{i}.0.linear.{weight,bias}           [h, 2h], [h]   Gumiho head i, first block (no residual)
    mlp.{i}.{j}.linear.{weight,bias}         [h, h], [h]    j = 1..blocks, residual SiLU blocks

Neither has an lm_head or a final norm: the target's lm_head scores the drafts over the full vocabulary, so an
official checkpoint becomes a drafter with draft_vocab_size 0, and exporting one of ours drops its draft vocabulary.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import torch

from ..errors import GumihoError
from .base import Drafter, DrafterConfig

# Official name inside `layers.{l}.` -> ours inside `transformer.layers.{l}.`.
LAYER_KEYS = {
    "self_attn.q_proj.weight": "self_attn.q_proj.weight",
    "self_attn.k_proj.weight": "self_attn.k_proj.weight",
    "self_attn.v_proj.weight": "self_attn.v_proj.weight",
    "self_attn.o_proj.weight": "self_attn.o_proj.weight",
    "mlp.gate_proj.weight": "gate_proj.weight",
    "mlp.up_proj.weight": "up_proj.weight",
    "mlp.down_proj.weight": "down_proj.weight",
    "input_layernorm.weight": "input_layernorm.weight",
    "post_attention_layernorm.weight": "post_attention_layernorm.weight",
}
EMBED = "embed_tokens.weight"
KIND_NAMES = {"gumiho": "Gumiho", "eagle2": "EAGLE"}
# Defaults of the official EConfig / rotary embedding for fields a config.json leaves out.
ECONFIG_DEFAULTS = {"rms_norm_eps": 1e-6, "rope_theta": 10000.0}


@dataclass
class OfficialCheckpoint:
    """An official state dict (official key names, any float dtype) with its config.json (empty when absent)."""

    state: dict[str, torch.Tensor]
    source: str
    config: dict = field(default_factory=dict)

    @property
    def kind(self) -> str:
        if any(k.startswith(("midlayer.", "d2t", "t2d")) for k in self.state):
            raise GumihoError(f"{self.source} is an EAGLE-3 checkpoint; only EAGLE-1/EAGLE-2 and Gumiho are supported")
        return "gumiho" if any(k.startswith("mlp.") for k in self.state) else "eagle2"

    @property
    def fc_bias(self) -> bool:
        """Gumiho's official module always has fc.bias; EAGLE's has it unless config.json says "bias": false."""
        if self.kind == "gumiho":
            return True
        return bool(self.config.get("bias", True)) if self.config else "fc.bias" in self.state

    def tensor(self, key: str) -> torch.Tensor:
        if key not in self.state:
            raise GumihoError(f"{self.source} has no {key}: it is not an official {KIND_NAMES[self.kind]} checkpoint")
        return self.state[key]


def infer_config(ckpt: OfficialCheckpoint, target_config) -> DrafterConfig:
    """The drafter's shape: from config.json where there is one, else from the target's config and the tensors."""
    kind, h = ckpt.kind, target_config.hidden_size
    fc = ckpt.tensor("fc.weight")
    if tuple(fc.shape) != (h, 2 * h):
        raise GumihoError(f"{ckpt.source}: fc.weight is {_shape(fc)}; a drafter for this target (hidden size {h}) "
                          f"needs {_shape((h, 2 * h))}")
    layers = sorted({int(m.group(1)) for k in ckpt.state if (m := re.match(r"layers\.(\d+)\.", k))})
    heads = sorted({int(m.group(1)) for k in ckpt.state if (m := re.match(r"mlp\.(\d+)\.", k))})
    blocks = sorted({int(m.group(1)) for k in ckpt.state if (m := re.match(r"mlp\.0\.(\d+)\.", k))})
    config = DrafterConfig.for_target(
        kind, target_config, num_layers=len(layers) or 1,
        intermediate_size=ckpt.tensor("layers.0.mlp.gate_proj.weight").shape[0],
        mlp_heads=len(heads), mlp_blocks=max(len(blocks) - 1, 0) if kind == "gumiho" else 5,
    )
    if ckpt.config:
        _apply_config_json(config, ckpt)
    else:
        _infer_attention_heads(config, ckpt)
    return config


def _apply_config_json(config: DrafterConfig, ckpt: OfficialCheckpoint) -> None:
    c, source = ckpt.config, f"{ckpt.source} config.json"
    for name, ours in (("hidden_size", config.hidden_size), ("vocab_size", config.vocab_size)):
        if name in c and c[name] != ours:
            raise GumihoError(f"{source}: {name} is {c[name]}; the target's is {ours}")
    if c.get("rope_scaling"):
        raise GumihoError(f"{source}: rope_scaling {c['rope_scaling']} is not supported (plain RoPE only)")
    for name, held in (("num_hidden_layers", config.num_layers), ("intermediate_size", config.intermediate_size)):
        if name in c and c[name] != held:
            raise GumihoError(f"{source}: {name} is {c[name]}; the weights' is {held}")
    config.num_attention_heads = c.get("num_attention_heads", config.num_attention_heads)
    config.num_key_value_heads = c.get("num_key_value_heads", config.num_attention_heads)
    config.rms_norm_eps = float(c.get("rms_norm_eps", ECONFIG_DEFAULTS["rms_norm_eps"]))
    config.rope_theta = float(c.get("rope_theta", ECONFIG_DEFAULTS["rope_theta"]))


def _infer_attention_heads(config: DrafterConfig, ckpt: OfficialCheckpoint) -> None:
    """No config.json: the target's head size; the key/value head count from k_proj's rows."""
    head_dim = config.hidden_size // config.num_attention_heads
    q, k = ckpt.tensor("layers.0.self_attn.q_proj.weight"), ckpt.tensor("layers.0.self_attn.k_proj.weight")
    if q.shape[0] != config.hidden_size or k.shape[0] % head_dim:
        raise GumihoError(
            f"{ckpt.source}: cannot tell the attention heads from q_proj {_shape(q)} / k_proj {_shape(k)} with the "
            f"target's head size {head_dim}; add num_attention_heads and num_key_value_heads to its config.json"
        )
    config.num_key_value_heads = k.shape[0] // head_dim


def expected_shapes(config: DrafterConfig, fc_bias: bool) -> dict[str, tuple[int, ...]]:
    """Every key an official checkpoint of this shape holds, embed_tokens.weight included."""
    h, i = config.hidden_size, config.intermediate_size
    kv = config.num_key_value_heads * (h // config.num_attention_heads)
    shapes: dict[str, tuple[int, ...]] = {EMBED: (config.vocab_size, h), "fc.weight": (h, 2 * h)}
    if fc_bias:
        shapes["fc.bias"] = (h,)
    layer = {"self_attn.q_proj.weight": (h, h), "self_attn.k_proj.weight": (kv, h), "self_attn.v_proj.weight": (kv, h),
             "self_attn.o_proj.weight": (h, h), "mlp.gate_proj.weight": (i, h), "mlp.up_proj.weight": (i, h),
             "mlp.down_proj.weight": (h, i), "input_layernorm.weight": (h,), "post_attention_layernorm.weight": (h,)}
    for n in range(config.num_layers):
        shapes.update({f"layers.{n}.{k}": s for k, s in layer.items() if n or k != "input_layernorm.weight"})
    for m in range(config.mlp_heads):
        for j in range(config.mlp_blocks + 1):
            shapes[f"mlp.{m}.{j}.linear.weight"] = (h, 2 * h if j == 0 else h)
            shapes[f"mlp.{m}.{j}.linear.bias"] = (h,)
    return shapes


def check_keys(ckpt: OfficialCheckpoint, config: DrafterConfig) -> None:
    """Strict: every expected key present with its shape, nothing else (embed_tokens.weight may be left out)."""
    expected = expected_shapes(config, ckpt.fc_bias)
    missing = sorted(set(expected) - set(ckpt.state) - {EMBED}, key=_natural)
    unexpected = sorted(set(ckpt.state) - set(expected), key=_natural)
    if missing:
        raise GumihoError(f"{ckpt.source}: missing key(s) {_few(missing)} for a {KIND_NAMES[ckpt.kind]} drafter")
    if unexpected:
        raise GumihoError(f"{ckpt.source}: unexpected key(s) {_few(unexpected)} for a {KIND_NAMES[ckpt.kind]} drafter")
    for key in sorted(ckpt.state, key=_natural):
        if tuple(ckpt.state[key].shape) != expected[key]:
            needs = "the target's embedding is" if key == EMBED else "this drafter needs"
            raise GumihoError(f"{ckpt.source}: {key} is {_shape(ckpt.state[key])}; {needs} {_shape(expected[key])}")


def to_ours(ckpt: OfficialCheckpoint, config: DrafterConfig) -> dict[str, torch.Tensor]:
    """Our state dict (fp32) from a checked official one; a missing fc.bias becomes zeros."""
    s = {k: v.float() for k, v in ckpt.state.items()}
    h = config.hidden_size
    ours = {"transformer.fc.weight": s["fc.weight"], "transformer.fc.bias": s.get("fc.bias", torch.zeros(h))}
    for n in range(config.num_layers):
        for theirs, mine in LAYER_KEYS.items():
            if f"layers.{n}.{theirs}" in s:
                ours[f"transformer.layers.{n}.{mine}"] = s[f"layers.{n}.{theirs}"]
    if config.mlp_heads:
        heads, blocks = range(config.mlp_heads), range(1, config.mlp_blocks + 1)
        ours["heads.in_weight"] = torch.stack([s[f"mlp.{m}.0.linear.weight"].T for m in heads])
        ours["heads.in_bias"] = torch.stack([s[f"mlp.{m}.0.linear.bias"] for m in heads])
        ours["heads.block_weight"] = torch.stack(
            [torch.stack([s[f"mlp.{m}.{j}.linear.weight"].T for j in blocks]) for m in heads])
        ours["heads.block_bias"] = torch.stack(
            [torch.stack([s[f"mlp.{m}.{j}.linear.bias"] for j in blocks]) for m in heads])
    return {k: v.contiguous() for k, v in ours.items()}


def from_ours(drafter: Drafter) -> dict[str, torch.Tensor]:
    """The official state dict of one of our drafters, without embed_tokens.weight (the caller adds the target's).
    The draft vocabulary (if any) is dropped: the official formats always score the full vocabulary."""
    state = drafter.state_dict()
    out = {"fc.weight": state["transformer.fc.weight"], "fc.bias": state["transformer.fc.bias"]}
    for n in range(drafter.config.num_layers):
        for theirs, mine in LAYER_KEYS.items():
            if f"transformer.layers.{n}.{mine}" in state:
                out[f"layers.{n}.{theirs}"] = state[f"transformer.layers.{n}.{mine}"]
    for m in range(drafter.config.mlp_heads):
        out[f"mlp.{m}.0.linear.weight"] = state["heads.in_weight"][m].T
        out[f"mlp.{m}.0.linear.bias"] = state["heads.in_bias"][m]
        for j in range(1, drafter.config.mlp_blocks + 1):
            out[f"mlp.{m}.{j}.linear.weight"] = state["heads.block_weight"][m, j - 1].T
            out[f"mlp.{m}.{j}.linear.bias"] = state["heads.block_bias"][m, j - 1]
    return {k: v.detach().contiguous() for k, v in out.items()}


def config_json(config: DrafterConfig, max_position_embeddings: int, dtype: torch.dtype) -> dict:
    """The Llama-style config.json the official loaders read (EConfig fields plus EAGLE's "bias")."""
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
        "hidden_size": config.hidden_size, "intermediate_size": config.intermediate_size,
        "num_attention_heads": config.num_attention_heads, "num_key_value_heads": config.num_key_value_heads,
        "num_hidden_layers": config.num_layers, "max_position_embeddings": max_position_embeddings,
        "rms_norm_eps": config.rms_norm_eps, "rope_theta": config.rope_theta, "rope_scaling": None,
        "vocab_size": config.vocab_size, "tie_word_embeddings": False, "bias": True,
        "torch_dtype": str(dtype).removeprefix("torch."),
    }


def _shape(t) -> str:
    return "[" + ", ".join(str(d) for d in (t.shape if isinstance(t, torch.Tensor) else t)) + "]"


def _few(keys: list[str]) -> str:
    return ", ".join(keys[:4]) + (f" and {len(keys) - 4} more" if len(keys) > 4 else "")


def _natural(key: str) -> list:
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", key)]
