"""A drafter's shape, stored as its folder's config.json: what a Drafter and its layers are built from."""

from __future__ import annotations

from dataclasses import dataclass, fields

from ..errors import GumihoError

# kind -> (decoder layers, heads, blocks per head) of a new drafter. Medusa and Hydra have no Transformer: their 4
# heads of one residual block each (the papers' defaults) read the target's own last feature.
# The draft-free methods (lookup, recycle) have no network: their config only records the target's sizes.
SHAPES = {"eagle2": (1, 0, 5), "gumiho": (2, 5, 5), "medusa": (0, 4, 1), "hydra": (0, 4, 1), "lookup": (0, 0, 0),
          "recycle": (0, 0, 0)}


@dataclass
class DrafterConfig:
    """The numbers a drafter is built from; `for_target` copies the target's layer shape."""

    kind: str  # "eagle2" | "gumiho" | "medusa" | "hydra" | "lookup" | "recycle" (no weights)
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    num_layers: int
    rope_theta: float
    rms_norm_eps: float
    vocab_size: int
    draft_vocab_size: int = 0  # 0: propose from the full vocabulary; else from the ids in the `draft_vocab` buffer
    mlp_heads: int = 0
    # Gumiho: residual blocks after each head's input layer; Medusa, Hydra: residual blocks per head
    mlp_blocks: int = 5
    target: str = ""

    @classmethod
    def for_target(cls, kind: str, target_config, **overrides) -> DrafterConfig:
        if kind not in SHAPES:
            raise GumihoError(f"unknown drafter kind {kind!r}; kinds: {', '.join(SHAPES)}")
        layers, heads, blocks = SHAPES[kind]
        rope = getattr(target_config, "rope_parameters", None) or {}
        theta = rope.get("rope_theta", getattr(target_config, "rope_theta", 10000.0))
        base = dict(
            kind=kind,
            hidden_size=target_config.hidden_size,
            intermediate_size=target_config.intermediate_size,
            num_attention_heads=target_config.num_attention_heads,
            num_key_value_heads=target_config.num_key_value_heads,
            num_layers=layers,
            rope_theta=float(theta),
            rms_norm_eps=target_config.rms_norm_eps,
            vocab_size=target_config.vocab_size,
            mlp_heads=heads,
            mlp_blocks=blocks,
        )
        base.update(overrides)
        return cls(**base)

    @classmethod
    def from_dict(cls, data: dict) -> DrafterConfig:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})
