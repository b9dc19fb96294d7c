"""Built-in evaluation: per-position chain accuracy on held-out features, and tau through the engine.

Chain accuracy at depth d: from an accepted prefix ending at slot i (root x_{i+1}), the share of origins whose
first d draft tokens all equal the target's greedy tokens, each step fed the previous step's *draft* feature, as
in decoding. All origins run at once: the real sequence fills the draft cache, then "stream" s holds step s+1 of
every origin at position i+s, seeing the real slots <= i and its own earlier streams. Medusa's and Hydra's head k
reads f_i (Hydra: and the root and the tokens before its own) and drafts depth k + 1; they draft no deeper than
their heads.

A step is fed the target's greedy tokens before it rather than the draft's own: where they differ the chain has
already failed, so the accuracy is the same, and every origin's steps run in one call.
"""

from __future__ import annotations

import torch

from ..drafters import Drafter, GumihoDrafter, HeadDrafter
from ..drafters.layers import KVCache
from ..errors import GumihoError
from ..target import Target
from .features import Sequence

DEPTH = 7


def _stream_mask(n: int, streams: int, device) -> torch.Tensor:
    """[1, 1, n, (streams + 1) n]: query i sees real slots <= i and slot i of each stream so far (itself included)."""
    parts = [torch.ones(n, n, dtype=torch.bool, device=device).tril()]
    parts += [torch.eye(n, dtype=torch.bool, device=device)] * streams
    return torch.cat(parts, 1)[None, None]


def _greedy(drafter: Drafter, hidden: torch.Tensor) -> torch.Tensor:
    return drafter.top_tokens(hidden, 1)[1][..., 0]


@torch.inference_mode()
def chain_predictions(drafter: Drafter, target: Target, seq: Sequence, depth: int = DEPTH):
    """Draft tokens [origins, depth], the target's greedy tokens at the same places [origins, depth], and which
    origins count [origins] (those whose `depth` drafted tokens are all assistant tokens). A head drafter's depth
    is at most its number of heads."""
    dev = target.device
    if isinstance(drafter, HeadDrafter):
        depth = min(depth, drafter.config.mlp_heads)
    ids, feats = seq.input_ids.to(dev), seq.features.to(dev, torch.float32)
    t = ids.shape[0]
    origins = torch.arange(t - 1, device=dev)
    greedy = torch.full((t + depth + 1,), 0, dtype=torch.long, device=dev)
    greedy[1: t + 1] = (feats @ target.head_weight.float().T).argmax(-1)  # y_{j+1}: target's token after x_{<=j}
    labels = torch.stack([greedy[origins + 2 + s] for s in range(depth)], 1)
    chain = _head_chain if isinstance(drafter, HeadDrafter) else _feature_chain
    predicted = chain(drafter, ids, feats, labels)
    mask = torch.cat([seq.loss_mask.to(dev), torch.zeros(depth + 2, dtype=torch.bool, device=dev)])
    counted = torch.stack([mask[origins + 2 + s] for s in range(depth)], 1).all(1)
    return predicted, labels, counted


def _head_chain(drafter: HeadDrafter, ids: torch.Tensor, feats: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    roots = ids[1:, None]
    return torch.stack([_greedy(drafter, drafter.predict(feats[:-1], torch.cat([roots, labels[:, :k]], 1), k))
                        for k in range(labels.shape[1])], 1)


def _feature_chain(drafter: Drafter, ids: torch.Tensor, feats: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    n, depth, dev = labels.shape[0], labels.shape[1], labels.device
    tr, cache = drafter.transformer, KVCache(drafter.config.num_layers)
    positions = torch.arange(n, device=dev)
    h = tr(tr.fuse(drafter.embed(ids[1:]), feats[:-1])[None], positions, None, cache)[0]
    predicted = [_greedy(drafter, h)]
    serial_steps = 2 if isinstance(drafter, GumihoDrafter) else depth
    fused_prev = None
    for s in range(1, serial_steps):
        fused_prev = tr.fuse(drafter.embed(labels[:, s - 1]), h)
        h = tr(fused_prev[None], positions + s, _stream_mask(n, s, dev), cache)[0]
        predicted.append(_greedy(drafter, h))
    if isinstance(drafter, GumihoDrafter):
        second = tr.fuse(drafter.embed(labels[:, 1]), h)
        heads = drafter.heads(torch.cat([fused_prev, second], -1))[: depth - 2]
        predicted += list(_greedy(drafter, heads))
    return torch.stack(predicted, 1)


def chain_hits(drafter: Drafter, target: Target, seq: Sequence, depth: int = DEPTH) -> torch.Tensor:
    """[counted origins, depth] bool: step s matched the target's greedy token (not yet chained)."""
    predicted, labels, counted = chain_predictions(drafter, target, seq, depth)
    return (predicted == labels)[counted]


def chain_accuracy(drafter: Drafter, target: Target, sequences: list[Sequence], depth: int = DEPTH) -> list[float]:
    """Accuracy at depth 1..`depth` (each depth requires all earlier steps right), pooled over all origins."""
    drafter.attach(target.embed_weight.float(), target.head_weight.float())
    drafter.eval()
    hits = torch.cat([chain_hits(drafter, target, s, depth).cpu() for s in sequences])
    if hits.shape[0] == 0:
        return [0.0] * hits.shape[1]
    return [round(v, 4) for v in hits.cumprod(1).float().mean(0).tolist()]


@torch.inference_mode()
def vocab_coverage(drafter: Drafter, target: Target, sequences: list[Sequence]) -> float:
    """Share of the target's greedy tokens at assistant positions that the draft vocabulary can propose at all:
    an upper bound on every draft step's acceptance."""
    if drafter.draft_vocab is None:
        return 1.0
    allowed = torch.zeros(target.vocab_size, dtype=torch.bool)
    allowed[drafter.draft_vocab.cpu()] = True
    head = target.head_weight.float()
    hits = total = 0
    for seq in sequences:
        predicting = seq.loss_mask[1:]  # feature j predicts token j + 1
        greedy = (seq.features[:-1][predicting].to(head.device).float() @ head.T).argmax(-1).cpu()
        hits, total = hits + int(allowed[greedy].sum()), total + greedy.numel()
    return round(hits / max(total, 1), 4)


def tau_on_prompts(drafter: Drafter, target: Target, paths: list[str], limit: int = 0,
                   max_new_tokens: int = 128) -> dict[str, dict]:
    """Per prompts file, mean tau (tokens per cycle) over its prompts at T = 0 with the method's default tree. The
    drafter is prepared for inference once (its matmuls are replaced in place: a second preparation would find
    them gone). A prompt that leaves no room for `max_new_tokens` in the model's context is skipped and counted (a
    file of held-out conversations can hold a document longer than the context)."""
    from ..engine import Engine, GenerationConfig
    from ..prompts import read_prompts

    engine = Engine(target)
    engine.add_drafter(drafter.kind, drafter)
    config = GenerationConfig(max_new_tokens=max_new_tokens, trace=False)
    results = {}
    for path in paths:
        prompts = read_prompts(path)
        prompts = prompts[:limit] if limit else prompts
        taus, tokens, cycles, skipped = [], 0, 0, 0
        for prompt in prompts:
            ids = target.encode_prompt(prompt, chat=config.chat)
            if len(ids) + max_new_tokens > target.max_context:
                skipped += 1
                continue
            trace = engine.generate(prompt, drafter.kind, config, prompt_ids=ids)
            taus.append(trace.tau)
            tokens, cycles = tokens + trace.new_tokens - 1, cycles + trace.cycles  # the prefill token is no cycle's
        if not taus:
            raise GumihoError(f"{path}: no prompt leaves room for {max_new_tokens} new tokens in the model's context")
        results[path] = {"prompts": len(taus), "skipped": skipped, "tau_mean": round(sum(taus) / len(taus), 3),
                         "tau_pooled": round(tokens / max(cycles, 1), 3)}
    return results
