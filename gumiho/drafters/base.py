"""What every drafter shares: save/load, the target's embedding and lm_head; and the feature-level drafters' draft
Transformer with its KV cache.

A drafter sees pairs (target feature f_j, next token x_{j+1}). The engine hands it the pairs of every newly
accepted position; `propose` drafts a `DraftPool` under the last token (the root). The draft never touches the
target's KV cache. `Drafter` is the base of every drafter. `FeatureDrafter` (EAGLE, Gumiho) adds the fc +
decoder-layer Transformer and its own KV cache, which holds only the accepted prefix: `propose` appends the new
pairs to it first. `HeadDrafter` (Medusa, Hydra) has heads on the target's last feature instead, drafting a static
tree, and keeps nothing between cycles. `WeightFreeDrafter` (prompt lookup, Token Recycling) has no network: it drafts
from the tokens seen so far, or from what the target itself predicted (`observe`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from ..acceptance import Acceptance, borrowed_methods
from ..errors import GumihoError
from ..int4 import Int4Matrix
from ..kernels import row_ops
from ..llama import CausalAttention, DecoderStack, StaticCache, float_matrix
from ..packed import PackedMatrix
from ..sampling import SamplingConfig
from ..static_tree import layout
from ..trace import JointCheck
from ..tree import DraftPool, DraftTree, TreeSettings
from ..verify import Acceptance as Verdict, LazyLogits, verify
from .config import DrafterConfig
from .frequency import most_frequent, read_counts, write_counts
from .layers import DraftTransformer, KVCache, MakeMatrix, lean_layers, lean_stack


FUSED_TOP_K = 32  # the widest top-k taken in one pass (kernels/rows.cpp keeps it by insertion); MJSD's wider ones
# (its sampling filters' top-k, up to the whole vocabulary) take torch's


def top_logprobs(logits: torch.Tensor, k: int, temperature: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """The top-k log-probs (at `temperature`) of each row of `logits` [..., V] and their indices; k is capped at V.
    A row with a NaN scores -inf."""
    logits = logits.float()
    k = min(k, logits.shape[-1])  # fewer when the vocabulary is smaller
    fused = row_ops() if logits.device.type == "cpu" and k <= FUSED_TOP_K and not logits.requires_grad else None
    if fused is not None:  # one call instead of four passes over the vocabulary (kernels/rows.cpp)
        values, idx = fused.top_logprobs(logits.reshape(-1, logits.shape[-1]), k, temperature)
        return values.view(*logits.shape[:-1], k), idx.view(*logits.shape[:-1], k)
    logp = torch.log_softmax(logits / temperature, -1).nan_to_num(nan=-torch.inf)
    return torch.topk(logp, k, dim=-1)


class Drafter(nn.Module):
    """Base class: files, the shared embedding and lm_head, the draft vocabulary. Subclasses implement `draft`."""

    kind = ""

    def __init__(self, config: DrafterConfig):
        super().__init__()
        self.config = config
        if config.draft_vocab_size:
            self.register_buffer("draft_vocab", torch.arange(config.draft_vocab_size, dtype=torch.long))
        else:
            self.draft_vocab = None
        self.embed_weight: torch.Tensor | None = None
        self.head_weight: torch.Tensor | None = None
        self.vocab_counts: torch.Tensor | None = None  # how often each draft-vocabulary id occurs (frequency.py)
        self.acceptance: Acceptance | None = None  # calibration statistics for automatic trees (choice.py)
        self.acceptance_for: dict[str, Acceptance] = {}  # those of methods drafting with these weights (EAGLE-1)

    # --- shared weights -------------------------------------------------------------------------------------------
    def attach(self, embed_weight: torch.Tensor, head_weight: torch.Tensor, pack: bool = True) -> Drafter:
        """Share the target's (frozen) embedding and lm_head; they are never stored in the drafter's files.
        `pack`: oneDNN-packed fp32 draft head on CPU (see packed.py)."""
        hidden, vocab = self.config.hidden_size, self.config.vocab_size
        if embed_weight.shape != (vocab, hidden) or head_weight.shape != (vocab, hidden):
            raise GumihoError(
                f"the drafter does not fit the target: drafter hidden {hidden} / vocabulary {vocab}, "
                f"target {embed_weight.shape[1]} / {embed_weight.shape[0]}"
            )
        self.to(device=embed_weight.device, dtype=embed_weight.dtype)
        self.embed_weight = embed_weight.detach()
        head = head_weight.detach()
        self.head_weight = head[self.draft_vocab] if self.draft_vocab is not None else head
        self._head = PackedMatrix(self.head_weight, pack=pack)
        return self

    def quantize_head(self) -> None:
        """Rank draft tokens with a 4-bit copy of the draft head (the int4 path: `Target.prepare_drafter`)."""
        self._head = Int4Matrix.quantize(self.head_weight)

    def use_full_vocab(self) -> Drafter:
        """Propose from the target's whole vocabulary. The draft head is the target's lm_head restricted to the
        draft vocabulary, so a drafter trained with one runs on all of it: this measures what the restriction
        costs. Call before `attach`."""
        self.draft_vocab = None
        self.config.draft_vocab_size = 0
        return self

    def keep_frequent(self, keep: int, always: set[int] = frozenset()) -> None:
        """Propose from the `keep` most frequent ids of the draft vocabulary only, `always` (the end tokens) among
        them (FR-Spec; where the folder ships their counts and the vocabulary is larger). Drafts are only
        proposals, so exactness is untouched; the draft head gets cheaper. Call before `attach`."""
        if self.vocab_counts is None or self.draft_vocab is None or keep >= self.draft_vocab.numel():
            return
        ranking = self.vocab_counts.clone()
        ranking[torch.isin(self.draft_vocab, torch.tensor(sorted(always), dtype=torch.long))] = ranking.max() + 1
        kept = most_frequent(ranking, keep)
        self.draft_vocab, self.vocab_counts = self.draft_vocab[kept], self.vocab_counts[kept]
        self.config.draft_vocab_size = keep

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        return nn.functional.embedding(tokens, self.embed_weight)

    def head_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Draft logits over the draft vocabulary (the full vocabulary when there is none)."""
        return self._head(hidden)

    def top_tokens(self, hidden: torch.Tensor, k: int, temperature: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
        """Top-k draft log-probs (at `temperature`) and their token ids (in the target's vocabulary) for each row of
        `hidden`; k is capped at the draft vocabulary's size. A row whose fp16 activations overflowed (NaN) scores
        -inf: its drafts rank last and the tree stays closed under parent-of (a NaN would sort above its parent)."""
        values, idx = top_logprobs(self.head_logits(hidden), k, temperature)
        if self.draft_vocab is not None:
            idx = self.draft_vocab[idx]
        return values, idx

    # --- drafting ------------------------------------------------------------------------------------------------
    def reset(self) -> None:
        """Forget the previous generation (called before each one)."""

    @torch.inference_mode()
    def propose(self, features: torch.Tensor, tokens: torch.Tensor, tree: TreeSettings) -> DraftPool:
        """Take the newly accepted pairs and draft a candidate pool under tokens[-1] (the root)."""
        return self.draft(features, tokens, tree)

    def first_score(self, root: int) -> float | None:
        """The score of the best candidate a draft would put under `root`, where the drafter knows it before drafting
        and `propose` changes nothing else (-inf: none); None where it does not. A sized run skips the draft of a
        cycle whose best candidate could not pay (`Sizer.could_pay`)."""
        return None

    def draft(self, features: torch.Tensor, tokens: torch.Tensor, tree: TreeSettings) -> DraftPool:
        raise NotImplementedError

    def observe(self, tokens: torch.Tensor, features: torch.Tensor, logits: LazyLogits | torch.Tensor | None = None,
                parents: list[int] | None = None) -> None:
        """What the target just computed; the engine calls it after every target forward (a no-op by default).

        tokens [n]: the forward's input tokens; features [n, H] (and a verification's logits: a `LazyLogits` whose
        `computed()` rows, those the acceptance walk read, are free, while any other row costs an lm_head call; or
        a [n, V] tensor) are the target's output at each, predicting the token after it. `parents` None: a stretch of the sequence
        (the prefill, over the prompt; logits None, since the engine computes only the last position's, and a
        drafter that wants them applies `head_logits` to the rows it needs). Else the verification of a draft
        tree in tree order: parents[i] is node i's parent (-1 for node 0, the root), and node i's output predicts
        the token after it *on its own branch*. Called before the accepted pairs reach `propose`."""

    def check_tree(self, tree: TreeSettings) -> None:
        """Raise GumihoError when this drafter cannot draft a tree of this shape (checked before a run starts)."""

    # --- how a run uses it: exact speculation by default; MJSD overrides all four (docs/design.md §16) ----------
    def run_sampling(self, sampling: SamplingConfig) -> SamplingConfig:
        """The sampling a run with this drafter applies (the trace records it)."""
        return sampling

    def approximation(self, tree: TreeSettings, sampling: SamplingConfig) -> str:
        """Why a run's output is not distributed as the target's; '' when it is."""
        return ""

    def start(self, sampling: SamplingConfig, eos_ids: frozenset[int], generator: torch.Generator) -> None:
        """Set up for one run (after `reset`): the run's sampling, end tokens and random generator."""

    def accept(self, tree: DraftTree, logits: LazyLogits, pool: DraftPool, sampling: SamplingConfig,
               generator: torch.Generator) -> tuple[Verdict, list[JointCheck]]:
        """The target's verdict on a tree drafted from `pool`: the longest prefix it agrees with plus a bonus token
        (verify.py), and no joint checks."""
        return verify(tree, logits, sampling, generator), []

    # --- files ----------------------------------------------------------------------------------------------------
    def save_pretrained(self, folder: str | Path, dtype: torch.dtype | None = None) -> None:
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "config.json").write_text(json.dumps(asdict(self.config), indent=2) + "\n")
        state = {k: (v.to(dtype) if dtype is not None and v.is_floating_point() else v).contiguous()
                 for k, v in self.state_dict().items()}
        save_file(state, str(folder / "model.safetensors"))
        if self.vocab_counts is not None:  # carried over from the drafter this one was trained from
            write_counts(folder, self.vocab_counts)

    @classmethod
    def from_config(cls, config: DrafterConfig) -> Drafter:
        from . import DRAFTERS, WEIGHT_FREE

        kinds = {**DRAFTERS, **WEIGHT_FREE}
        if config.kind not in kinds:
            raise GumihoError(f"unknown drafter kind {config.kind!r}")
        return kinds[config.kind](config)

    @classmethod
    def from_pretrained(cls, folder: str | Path) -> Drafter:
        folder = Path(folder)
        if not (folder / "config.json").is_file() or not (folder / "model.safetensors").is_file():
            raise GumihoError(f"{folder} is not a drafter folder (needs config.json and model.safetensors)")
        try:
            config = DrafterConfig.from_dict(json.loads((folder / "config.json").read_text()))
        except (json.JSONDecodeError, TypeError) as exc:
            raise GumihoError(f"{folder}/config.json is not a drafter config: {exc}") from exc
        model = cls.from_config(config)
        state = load_file(str(folder / "model.safetensors"))
        state = {k: v.float() if v.is_floating_point() else v for k, v in state.items()}
        missing, unexpected = model.load_state_dict(state, strict=False)
        if missing or unexpected:
            raise GumihoError(f"{folder} does not match a {config.kind} drafter (missing {missing}, unexpected {unexpected})")
        if model.draft_vocab is not None:
            model.vocab_counts = read_counts(folder, model.draft_vocab.numel())
        model.acceptance = Acceptance.load(folder)
        model.acceptance_for = {m: a for m in borrowed_methods(folder) if (a := Acceptance.load(folder, m))}
        return model.eval()


# The prompt positions a feature drafter's layers read: the last ones. Rotary positions make attention depend on
# distances only, so the window's first pair may sit at position 0. The shipped Gumiho drafter's τ on the first 4
# CNN/DM prompts (611-1,000 tokens; 2-core Zen 5, int4 path, interleaved): whole prompt 1.556, the last 512 / 256 /
# 128 / 64 pairs 1.552 / 1.574 / 1.546 / 1.567 (on ten short prompts of five other sets, 1.850 at every window).
# Its first draft, which reads the prompt, took 17-21 ms of a 0.6-0.75 s answer; every later draft step attends to
# the window instead of the whole prompt: speed over AR 1.096x -> 1.135x there.
PROMPT_WINDOW = 256


class FeatureDrafter(Drafter):
    """A drafter with EAGLE's feature-level Transformer (fc + `config.num_layers` decoder layers) and its own KV cache
    over the accepted prefix (docs/design.md §4). For inference (`Target.prepare_drafter`) the layers run as a
    `llama.DecoderStack` (`use_lean`); training runs the modules."""

    def __init__(self, config: DrafterConfig):
        super().__init__(config)
        self.transformer = DraftTransformer(config)
        self.lean: DecoderStack | None = None
        self.cache: KVCache | StaticCache = KVCache(config.num_layers)

    def use_lean(self, matrix: MakeMatrix,
                 prompts: tuple[torch.dtype | None, int, CausalAttention | None] | None = None) -> None:
        """Run the draft layers as the target's lean forward runs its own (`layers.lean_stack`), their products made
        by `matrix(weight)`. For an inference copy: the modules' weights are no longer read at inference.

        `prompts`: (dtype, from, attention), how the target runs a long prompt (LeanLlama's `prefill_dtype`,
        `prefill_from`, `prefill_attention`: on the int4 path, float weights where they were measured faster than 4
        bits, None where none was, and its causal attention). The drafter's pass over a prompt of `from` tokens or
        more then takes them too: a 769-token prompt through Gumiho's two layers, 71 -> 40 ms in bf16 on the Intel
        Xeon with AMX (EAGLE-2's one: 36 -> 21)."""
        self.lean = lean_stack(self.transformer, self.config, matrix)
        if prompts is not None:
            dtype, self.lean.prefill_from, self.lean.prefill_attention = prompts
            self.lean.prefill_dtype = dtype
            if dtype is not None:
                self.lean.prefill_layers = lean_layers(self.transformer, float_matrix(dtype))
        self.reset()

    def reset(self) -> None:
        self.cache = self.lean.new_cache() if self.lean is not None else KVCache(self.config.num_layers)

    def _layers(self, fused: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """The draft layers over fused inputs [T, H] at `positions` [T] after the cached prefix; `mask` [T, past + T]
        bool or None (causal). Returns [T, H]."""
        if self.lean is not None:  # a prompt from an empty cache takes SDPA's causal attention
            prefill = self.cache.length == 0 and mask is None
            return self.lean.run(fused[None], positions[None], self.cache, None if mask is None else mask[None],
                                 prefill)[0]
        if mask is None and self.cache.length:
            past, m = self.cache.length, fused.shape[0]
            mask = torch.ones(m, past + m, dtype=torch.bool, device=fused.device).tril(past)
        return self.transformer(fused[None], positions, None if mask is None else mask[None, None], self.cache)[0]

    def advance(self, features: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """Append accepted pairs (f_j, x_{j+1}) to the draft cache; returns the draft output at the last one [H]."""
        past, m = self.cache.length, tokens.shape[0]
        fused = self.transformer.fuse(self.embed(tokens), features.to(self.embed_weight.dtype))
        return self._layers(fused, torch.arange(past, past + m, device=tokens.device), None)[-1]

    def expand(self, fused: torch.Tensor, position: int, stable: int, own: torch.Tensor) -> torch.Tensor:
        """Run k tree nodes at one position. `own` [k, slots] marks which expansion slots (draft positions written
        after the stable prefix, this call's included) each node may see; the whole stable prefix is visible."""
        k = fused.shape[0]
        prefix = torch.ones(k, stable, dtype=torch.bool, device=fused.device)
        positions = torch.full((k,), position, device=fused.device)
        return self._layers(fused, positions, torch.cat([prefix, own], 1))

    @torch.inference_mode()
    def propose(self, features: torch.Tensor, tokens: torch.Tensor, tree: TreeSettings) -> DraftPool:
        """Draft as `Drafter.propose`; the cache then keeps the accepted prefix only (expansion KV never survives).
        Of a prompt (the first call on an empty cache) the draft layers read the last PROMPT_WINDOW pairs only."""
        if self.cache.length == 0:
            features, tokens = features[-PROMPT_WINDOW:], tokens[-PROMPT_WINDOW:]
        stable = self.cache.length + tokens.shape[0]
        try:
            return super().propose(features, tokens, tree)
        finally:
            self.cache.truncate(stable)


class HeadDrafter(Drafter):
    """Heads on the target's feature f_j at the last accepted position (Medusa, Hydra): head k proposes depth k + 1
    under the root x_{j+1}, in the method's static tree. No draft Transformer, no draft KV cache."""

    def predict(self, features: torch.Tensor, following: torch.Tensor, head: int) -> torch.Tensor:
        """Head `head`'s predicted features [R, H] for rows of target features [R, H] whose root and earlier draft
        tokens are `following` [R, head + 1]. Training and evaluation read the heads through it."""
        raise NotImplementedError

    def check_tree(self, tree: TreeSettings) -> None:
        plan = layout(self.kind, tree.depth, tree.total_tokens - 1)
        heads, vocab = self.config.mlp_heads, self.config.draft_vocab_size or self.config.vocab_size
        if plan.depth > heads:
            raise GumihoError(f"a {self.kind} tree of depth {plan.depth} needs {plan.depth} heads; this drafter has "
                              f"{heads} (depth at most {heads})")
        if plan.top_k > vocab:
            raise GumihoError(f"this {self.kind} tree takes a head's top {plan.top_k} tokens; the drafter proposes "
                              f"from {vocab}")

    def grown(self, blocks: int) -> HeadDrafter:
        """This drafter with `blocks` residual blocks per head: its own blocks first, then new ones that start as
        the identity (zero weight and bias: a + SiLU(0) = a), so the grown drafter drafts exactly as this one did
        and training goes on from there (Medusa's `medusa_num_layers`, Hydra's `hydra_num_layers`)."""
        have = self.config.mlp_blocks
        if blocks < have:
            raise GumihoError(f"this {self.kind} drafter has {have} blocks per head; it can grow, not shrink")
        grown = type(self)(replace(self.config, mlp_blocks=blocks))
        state = {}
        for name, new in grown.state_dict().items():
            old = self.state_dict()[name]
            if old.shape != new.shape:  # a stack of blocks, [heads, blocks, ...]: the old ones, then zeros
                old = torch.cat([old, old.new_zeros(old.shape[0], new.shape[1] - old.shape[1], *old.shape[2:])], 1)
            state[name] = old
        grown.load_state_dict(state)
        return grown.eval()


class WeightFreeDrafter(Drafter):
    """A drafter without a network or files (prompt lookup, Token Recycling; docs/design.md §17). Its config only
    records the target's sizes, so that it attaches like any drafter; it never uses the draft vocabulary. Its pool
    is scored so that a child never ranks above its parent, as `tree.build_tree` requires."""

    pack_head = False  # no oneDNN-packed copy of the lm_head where at most a few rows per generation go through it
    # The lm_head for many prompt rows at once, where the target's prompts take bf16 products on AMX tiles
    # (`Target.prepare_drafter`): set for a drafter with `pack_head`, None elsewhere.
    prompt_head: Callable[[torch.Tensor], torch.Tensor] | None = None

    def attach(self, embed_weight: torch.Tensor, head_weight: torch.Tensor, pack: bool = True) -> Drafter:
        return super().attach(embed_weight, head_weight, pack=pack and self.pack_head)

    def quantize_head(self) -> None:
        """No 4-bit copy of the lm_head either (the int4 path): the plain one serves those few rows."""

    def save_pretrained(self, folder: str | Path, dtype: torch.dtype | None = None) -> None:
        raise GumihoError(f"{self.kind} has no weights to save")
