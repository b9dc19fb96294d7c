"""`ship`: a finished run as a drafter folder (config.json, fp16 model.safetensors, README.md model card)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch

from ..drafters import DRAFTERS, Drafter, HeadDrafter
from ..errors import GumihoError
from ..trace import METHOD_NAMES


def loss_line(c: dict, kind: str) -> str:
    """The training objective of a run's config (docs/design.md §14.2; Medusa, Hydra: docs/training.md)."""
    if issubclass(DRAFTERS[kind], HeadDrafter):
        objective = (f"Loss: head k weighted 0.8^k x (SmoothL1 features x {c['head_feature_weight']} + soft CE x "
                     f"{c['head_ce_weight']})")
    else:
        objective = f"Loss: SmoothL1 features x 1.0 + soft CE x {c['ce_weight']}"
        if kind == "gumiho":
            objective += (f"; MLP heads 0.8^(i+1)/9 x (SmoothL1 + {c['mlp_ce_weight']} soft CE from epoch "
                          f"{c['mlp_ce_epoch']})")
    return (f"- {objective}; AdamW lr {c['lr']} (0.9, 0.95), warmup {c['warmup_steps']} then linear decay to 0, "
            f"clip-norm {c['clip_norm']}, noise {c['noise']}, seed {c['seed']}.")


def tokens_seen_by(folder: str | Path) -> int | None:
    """The tokens a shipped drafter has seen in all (its model card's cumulative count, else its run's count)."""
    card = Path(folder) / "README.md"
    if not card.is_file():
        return None
    text = card.read_text(encoding="utf-8")
    found = re.search(r"Cumulative tokens seen[^:]*: ([\d,]+)", text) or re.search(r"Tokens seen: ([\d,]+)", text)
    return int(found.group(1).replace(",", "")) if found else None


def model_card(summary: dict, evaluation: dict | None, kind: str, earlier_tokens: int | None = None) -> str:
    """`earlier_tokens`: what the initial drafter (`--init`) had seen, for the cumulative count."""
    c = summary["config"]
    final = summary.get("final", {})
    lines = [
        f"# SmolLM2-135M-Instruct {METHOD_NAMES[kind]} drafter",
        "",
        f"Draft head for speculative decoding with `python -m gumiho generate --method {kind}`. Holds only the "
        "drafter's own weights (fp16); the embedding and lm_head are the target's and are shared at load time.",
        "",
        "## Training",
        f"- Data: `{c['data']}` ({summary['sequences']} conversations, {summary['tokens_per_epoch']:,} tokens per "
        f"epoch, {summary['assistant_tokens_per_epoch']:,} of them assistant tokens); the commands that made it are in "
        "the repository README, section \"Train a drafter for your model\".",
        f"- Tokens seen: {summary['tokens_seen']:,}; epochs: {summary.get('epochs_seen', c['epochs'])}; "
        f"steps: {summary['steps']}; "
        f"wall time: {summary['wall_time_s'] / 60:.1f} min on {summary['device']}.",
        *([f"- Started from the drafter in `{c['init']}` (its draft vocabulary kept); the figures below cover this run "
            "only.",
           f"- Cumulative tokens seen (this run and the drafters it started from): "
           + (f"{earlier_tokens + summary['tokens_seen']:,} ({earlier_tokens:,} before this run)."
              if earlier_tokens is not None else "unknown (the initial drafter's card gives no count).")]
          if c.get("init") else []),
        *([f"- Residual blocks per head: {c['blocks']}"
           + (" (blocks the initial drafter lacked started as the identity)." if c.get("init") else ".")]
          if c.get("blocks") else []),
        *([f"- Training-time test: {c['unroll']} draft steps per position, steps 2.. fed the draft's own output."]
          if c.get("unroll", 1) > 1 else []),
        f"- Draft vocabulary: {summary.get('draft_vocab_size') or c['draft_vocab'] or 'full'} ids "
        f"(covers {100 * summary['draft_vocab_coverage']:.1f}% of the training assistant tokens).",
        loss_line(c, kind),
        "- Final training losses (mean of the last logged steps): "
        + ", ".join(f"{k} {v:.3f}" for k, v in final.items() if k not in ("step", "epoch")),
    ]
    if evaluation:
        lines += ["", "## Evaluation"]
        if "chain_accuracy" in evaluation:
            acc = evaluation["chain_accuracy"]
            fed = ("each head reading the target's feature" if issubclass(DRAFTERS[kind], HeadDrafter)
                   else "each step fed the draft's own features")
            lines.append(f"- Held-out chain accuracy, depth 1..{len(acc)} (draft tokens = target's greedy tokens, "
                         f"{fed}): " + ", ".join(f"{a:.3f}" for a in acc))
        if "draft_vocab_coverage" in evaluation:
            lines.append(f"- Draft vocabulary coverage of the target's greedy tokens on held-out replies: "
                         f"{100 * evaluation['draft_vocab_coverage']:.1f}% (an upper bound on per-step acceptance).")
        for path, tau in evaluation.get("tau", {}).items():
            lines.append(f"- tau on `{Path(path).parent.name}/{Path(path).name}` ({tau['prompts']} prompts, T=0, default CPU tree, "
                         f"{evaluation.get('max_new_tokens', 128)} new tokens): mean {tau['tau_mean']:.2f}, "
                         f"pooled {tau['tau_pooled']:.2f}")
    return "\n".join(lines) + "\n"


def merge_evaluations(paths: list[str | Path]) -> dict | None:
    """Several `eval --out` files as one: chain accuracy from any, tau results from all."""
    merged: dict = {}
    for path in paths:
        data = json.loads(Path(path).read_text())
        merged.setdefault("tau", {}).update(data.pop("tau", {}))
        merged.update(data)
    return merged or None


def ship(run: str | Path, dest: str | Path, evaluations: list[str | Path] = ()) -> Path:
    run, dest = Path(run), Path(dest)
    if not (run / "train.json").is_file():
        raise GumihoError(f"{run} is not a finished training run (no train.json)")
    summary = json.loads((run / "train.json").read_text())
    init = summary["config"].get("init")
    earlier = tokens_seen_by(init) if init else None  # read first: the destination may be the initial drafter
    drafter = Drafter.from_pretrained(run / "drafter")
    drafter.save_pretrained(dest, dtype=torch.float16)
    evaluation = merge_evaluations(list(evaluations))
    (dest / "README.md").write_text(model_card(summary, evaluation, drafter.kind, earlier))
    return dest
