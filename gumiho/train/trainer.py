"""The training loop: draft vocabulary, AdamW with warmup + linear decay to the real run length, clipping,
seeded noise, resumable checkpoints, and a final drafter folder plus a JSON summary in the run folder."""

from __future__ import annotations

import json
import logging
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from ..drafters import DRAFTERS, Drafter, HeadDrafter, new_drafter
from ..errors import GumihoError
from ..target import Target
from .batches import collate, epoch_order, on_device, plan_batches
from .features import Sequence, load_sequences
from .objective import LossWeights, batch_losses, mean_parts
from .options import option
from .precision import autocast, uses_bf16

log = logging.getLogger(__name__)

PROBE_SKIP = 5  # steps left out of the speed measurement of a run with a time budget


@dataclass
class TrainConfig:
    drafter: str = option("the drafter to train: " + ", ".join(DRAFTERS))
    data: str = option("feature folder(s) from `prepare`, comma-separated (repeat one to weight it)")
    out: str = option("run folder: checkpoints, the final drafter, train.json")
    draft_vocab: int = option("draft vocabulary: the N most frequent assistant tokens; 0: the full vocabulary", 8192)
    epochs: int = option("passes over the data (an upper bound with --minutes or --max-steps)", 2)
    lr: float = option("AdamW peak learning rate", 2e-4)
    warmup_steps: int = option("linear warm-up steps, then linear decay to zero at the run's end", 50)
    batch_tokens: int = option("tokens per batch", 4096)
    autocast: str = option("bf16 autocast for the drafter's matmuls (losses stay fp32): auto (on a CPU with bf16 "
                           "units), bf16 or off", "auto")
    max_len: int = option("cut sequences to this many tokens", 1024)
    max_sequences: int = option("use only the first N sequences; 0: all", 0)
    clip_norm: float = option("gradient clipping norm", 0.5)
    noise: float = option("uniform noise on the input features (spec: 0.2)", 0.2)
    ce_weight: float = option("weight of the soft cross-entropy against the target's distribution", 0.1)
    mlp_ce_weight: float = option("Gumiho: weight of the MLP heads' soft cross-entropy", 0.1)
    mlp_ce_epoch: int = option("Gumiho: the MLP heads' cross-entropy is off before this epoch", 1)
    head_feature_weight: float = option("Medusa, Hydra: weight of each head's feature loss (head k's terms are "
                                        "weighted 0.8^k)", 0.0)
    head_ce_weight: float = option("Medusa, Hydra: weight of each head's soft cross-entropy", 1.0)
    init: str = option("drafter folder to start from (same kind; its draft vocabulary is kept); empty: random", "")
    blocks: int = option("Medusa, Hydra: residual blocks per head; 0: the kind's default (1), or --init's. With "
                         "--init, more blocks than it has are added as the identity", 0)
    unroll: int = option("draft steps trained per position; steps 2.. read the draft's own output "
                         "(training-time test)", 1)
    seed: int = option("seed of weights, batches and noise", 0)
    checkpoint_every: int = option("steps between checkpoints (and one every epoch)", 50)
    log_every: int = option("steps between log lines", 10)
    max_steps: int = option("stop after this many steps; 0: epochs x batches per epoch", 0)
    minutes: float = option("> 0: time the first --probe-steps, then fix the run's length to fit this many "
                            "minutes (refitted at every log line, at the speed since the last one)", 0.0)
    probe_steps: int = option("steps timed for --minutes", 20)
    deadline: float = option("> 0: a time in epoch seconds (date +%%s) where the run stops, whatever its length, "
                             "and saves its drafter (a lent machine's end)", 0.0)


# Options that say only when a run stops: a resumed run may change them.
STOPPING_OPTIONS = ("deadline",)


def load_training_data(config: TrainConfig) -> list[Sequence]:
    sequences = [s for folder in config.data.split(",") if folder for s in load_sequences(folder)]
    if config.max_sequences:
        sequences = sequences[: config.max_sequences]
    sequences = [Sequence(s.input_ids[: config.max_len], s.loss_mask[: config.max_len], s.features[: config.max_len])
                 for s in sequences]
    return [s for s in sequences if len(s.input_ids) >= 3 and s.loss_mask[2:].any()]


def assistant_counts(sequences: list[Sequence], vocab_size: int) -> torch.Tensor:
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for s in sequences:
        counts += torch.bincount(s.input_ids[s.loss_mask], minlength=vocab_size)
    return counts


def coverage_of(ids: torch.Tensor, counts: torch.Tensor) -> float:
    """The share of assistant tokens (`counts`) that the vocabulary `ids` covers."""
    return counts[ids].sum().item() / max(counts.sum().item(), 1)


def frequency_vocab(counts: torch.Tensor, size: int, always: set[int]) -> tuple[torch.Tensor, float]:
    """The `size` most frequent assistant tokens (`counts`, plus `always`), sorted by id; and the share of assistant
    tokens they cover."""
    ranking = counts.clone()
    ranking[list(always)] = ranking.max() + 1
    ids = torch.topk(ranking, size).indices
    return ids.sort().values, coverage_of(ids, counts)


def check_kind(kind: str, blocks: int = 0) -> None:
    if kind not in DRAFTERS:
        raise GumihoError(f"--drafter must be one of {', '.join(DRAFTERS)}, not {kind!r}")
    if blocks and not issubclass(DRAFTERS[kind], HeadDrafter):
        raise GumihoError(f"--blocks applies to medusa and hydra, not {kind}")
    if blocks < 0:
        raise GumihoError(f"--blocks must be at least 1 (0: the default), not {blocks}")


def build_drafter(config: TrainConfig, target: Target, sequences: list[Sequence]) -> tuple[Drafter, float]:
    """A new drafter with a frequency-ranked draft vocabulary, or the `init` drafter; and the share of the data's
    assistant tokens its draft vocabulary covers."""
    check_kind(config.drafter, config.blocks)
    vocab_size = target.vocab_size
    if config.init:
        drafter = Drafter.from_pretrained(config.init)
        if drafter.kind != config.drafter:
            raise GumihoError(f"--init {config.init} is a {drafter.kind} drafter, not {config.drafter}")
        if config.blocks:
            counts, drafter = drafter.vocab_counts, drafter.grown(config.blocks)
            drafter.vocab_counts = counts
        coverage = 1.0 if drafter.draft_vocab is None else coverage_of(drafter.draft_vocab,
                                                                        assistant_counts(sequences, vocab_size))
    else:
        size = min(config.draft_vocab, vocab_size) if config.draft_vocab else 0
        shape = {"mlp_blocks": config.blocks} if config.blocks else {}
        drafter = new_drafter(config.drafter, target.model.config, seed=config.seed, draft_vocab_size=size,
                              target=target.name, **shape)
        coverage = 1.0
        if size:
            counts = assistant_counts(sequences, vocab_size)
            ids, coverage = frequency_vocab(counts, size, target.eos_ids)
            drafter.draft_vocab.copy_(ids)
            drafter.vocab_counts = counts[ids]  # written beside the weights: inference keeps the most frequent
    # Trained in fp32 whatever the target's dtype; the shared weights are frozen plain tensors, not parameters.
    drafter.attach(target.embed_weight.float(), target.head_weight.float())
    return drafter, coverage


def lr_lambda(warmup: int, total: int):
    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return max(0.0, (total - step) / max(1, total - warmup))

    return factor


def _without(options: dict, names: tuple[str, ...]) -> dict:
    return {k: v for k, v in options.items() if k not in names}


def planned_steps(config: TrainConfig, batches_per_epoch: int) -> int:
    full = config.epochs * batches_per_epoch
    return min(full, config.max_steps) if config.max_steps else full


def fit_to_budget(config: TrainConfig, steps_so_far: int, seconds: float, per_step: float,
                  batches_per_epoch: int) -> int:
    """Total steps that fit `config.minutes` when each further step takes `per_step` seconds; never more than the
    planned run, never fewer than the steps already taken."""
    affordable = steps_so_far + int((config.minutes * 60 - seconds) / max(per_step, 1e-9))
    return max(steps_so_far, min(planned_steps(config, batches_per_epoch), affordable))


def _device_name(dev: torch.device) -> str:
    if dev.type == "cuda":
        return torch.cuda.get_device_name(dev)
    return f"cpu, {torch.get_num_threads()} torch thread(s)" if dev.type == "cpu" else str(dev)


@dataclass
class RunLength:
    """The run's length in steps. A run with a time budget (`--minutes`) fixes it once its first steps are timed."""

    steps: int
    fixed: bool
    probe_from: float | None = None  # seconds into the run at step PROBE_SKIP, where the speed measurement starts

    def to_dict(self) -> dict:
        return {k: v for k, v in asdict(self).items() if v is not None}


@dataclass
class TrainState:
    """Everything the loop changes: the weights' optimizer and its schedule, where the run is, the loss history.
    `progress()` is what a checkpoint keeps besides the weights, optimizer and schedule."""

    drafter: Drafter
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    length: RunLength
    epoch: int = 0
    batch: int = 0  # batches done in this epoch
    step: int = 0
    tokens: int = 0
    elapsed: float = 0.0  # seconds of training, over every resumed attempt
    window_from: float = 0.0  # `elapsed` at the last log line
    history: list[dict] = field(default_factory=list)  # one mean of the loss parts per log line
    window: list[dict] = field(default_factory=list)  # the loss parts of each step since the last log line

    def progress(self) -> dict:
        return {"epoch": self.epoch, "batch": self.batch, "step": self.step, "tokens": self.tokens,
                "elapsed": self.elapsed, "history": self.history, "length": self.length.to_dict()}

    def resume(self, saved: dict) -> None:
        """Continue from a checkpoint (`save_checkpoint`'s dict)."""
        self.drafter.load_state_dict(saved["model"])
        self.optimizer.load_state_dict(saved["optimizer"])
        self.scheduler.load_state_dict(saved["scheduler"])
        progress = saved["state"]
        self.epoch, self.batch, self.step = progress["epoch"], progress["batch"], progress["step"]
        self.tokens, self.elapsed, self.history = progress["tokens"], progress["elapsed"], progress["history"]
        self.window_from = self.elapsed
        # In place: the schedule reads the run length from this object at every step.
        self.length.steps, self.length.fixed = progress["length"]["steps"], progress["length"]["fixed"]
        self.length.probe_from = progress["length"].get("probe_from")

    def optimize(self, loss: torch.Tensor, clip_norm: float) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trainable(self.drafter), clip_norm)
        self.optimizer.step()
        self.scheduler.step()


def trainable(drafter: Drafter) -> list[torch.nn.Parameter]:
    return [p for p in drafter.parameters() if p.requires_grad]


def new_state(config: TrainConfig, drafter: Drafter, batches_per_epoch: int) -> TrainState:
    """AdamW with warm-up and linear decay to the end of the run, whose length a time budget fixes later."""
    length = RunLength(steps=planned_steps(config, batches_per_epoch), fixed=config.minutes <= 0)
    optimizer = torch.optim.AdamW(trainable(drafter), lr=config.lr, betas=(0.9, 0.95), weight_decay=0.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_lambda(config.warmup_steps, length.steps)(step))
    return TrainState(drafter, optimizer, scheduler, length)


def fix_length(config: TrainConfig, state: TrainState, batches_per_epoch: int) -> None:
    """A run with a time budget, its first steps timed: as many steps as fit `config.minutes`."""
    probe_from = state.length.probe_from or 0.0
    per_step = (state.elapsed - probe_from) / max(state.step - (PROBE_SKIP if probe_from else 0), 1)
    state.length.steps = fit_to_budget(config, state.step, state.elapsed, per_step, batches_per_epoch)
    state.length.fixed = True
    log.info("run length fixed at %d steps (%.2f epochs) to fit %.1f min", state.length.steps,
             state.length.steps / batches_per_epoch, config.minutes)


def refit_length(config: TrainConfig, state: TrainState, batches_per_epoch: int, window_steps: int) -> None:
    """Refit a budgeted run's length at the speed of its last `window_steps` steps. Later steps can be slower than
    the probed ones (Gumiho's MLP losses start at --mlp-ce-epoch: an H100 went from 400k to 300k tokens/s), and a
    run fitted once then overran its minutes by 70%."""
    per_step = (state.elapsed - state.window_from) / max(window_steps, 1)
    steps = fit_to_budget(config, state.step, state.elapsed, per_step, batches_per_epoch)
    if steps != state.length.steps:
        log.info("run length refitted: %d steps", steps)
        state.length.steps = steps


def save_checkpoint(path: Path, config: TrainConfig, state: TrainState) -> None:
    """Written to a temporary file, then renamed: a stop or a full disk never damages the last good checkpoint."""
    tmp = path.with_suffix(".tmp")
    try:
        torch.save({"config": asdict(config), "model": state.drafter.state_dict(),
                    "optimizer": state.optimizer.state_dict(), "scheduler": state.scheduler.state_dict(),
                    "state": state.progress()}, tmp)
    except (OSError, RuntimeError) as exc:  # torch reports a full disk as a RuntimeError from its writer
        tmp.unlink(missing_ok=True)
        kept = f"the last good checkpoint {path} is kept" if path.exists() else "no checkpoint was written yet"
        raise GumihoError(f"cannot write {tmp} ({str(exc).splitlines()[0]}); {kept}") from exc
    tmp.replace(path)


def load_checkpoint(path: Path, device: torch.device) -> dict | None:
    """The saved run, or None when there is none or it cannot be read (then it is set aside as .corrupt, and said
    in one line: the run starts over from its --init, never silently)."""
    if not path.exists():
        return None
    try:
        return torch.load(path, map_location=device, weights_only=False)
    except Exception as exc:  # a truncated or damaged file: pickle, zip and torch errors alike
        aside = path.with_suffix(".corrupt")
        path.replace(aside)
        log.warning("skipping the unreadable checkpoint %s (%s; moved to %s): starting this run over",
                    path, type(exc).__name__, aside.name)
        return None


def write_length(out: Path, length: RunLength, batches_per_epoch: int) -> None:
    """The run's length in steps, for a second run that must match it (`--max-steps`); written whole at once, since
    scripts/train_drafters.sh waits for the file."""
    tmp = out / "length.json.tmp"
    tmp.write_text(json.dumps({"steps": length.steps, "batches_per_epoch": batches_per_epoch}) + "\n")
    tmp.replace(out / "length.json")


def log_progress(config: TrainConfig, state: TrainState) -> None:
    """Append the mean loss parts since the last log line to the history, and log them."""
    mean = mean_parts(state.window)
    state.window, state.window_from = [], state.elapsed
    state.history.append({"step": state.step, "epoch": state.epoch, **mean})
    rate = state.tokens / max(state.elapsed, 1e-9)
    eta = (state.length.steps - state.step) * state.elapsed / state.step
    log.info("step %d/%d epoch %d loss %.4f lv %.4f lp %.3f acc1 %.3f%s%s | %.0f tok/s, eta %.0f min",
             state.step, state.length.steps, state.epoch, mean["loss"], mean["lv"], mean["lp"], mean["acc1"],
             "".join(f" acc{k} {mean[f'acc{k}']:.3f}" for k in range(2, 10) if f"acc{k}" in mean),
             "".join(f" mlp{i} {mean[f'acc_mlp{i}']:.3f}" for i in range(5) if f"acc_mlp{i}" in mean),
             rate, eta / 60)


def train(config: TrainConfig, target: Target) -> Path:
    if config.unroll < 1:
        raise GumihoError(f"--unroll must be >= 1, got {config.unroll}")
    log.info("bf16 autocast %s", "on" if uses_bf16(target.device, config.autocast) else "off")
    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(config.seed)
    sequences = load_training_data(config)
    if not sequences:
        raise GumihoError(f"no usable training sequences in {config.data}")
    drafter, coverage = build_drafter(config, target, sequences)
    drafter.train()
    dev = target.device
    sequences = on_device(sequences, dev)
    if dev.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True  # the drafter trains in fp32; TF32 matmuls are far faster
    groups = plan_batches([len(s.input_ids) for s in sequences], config.batch_tokens)
    state = new_state(config, drafter, len(groups))
    checkpoint = out / "checkpoint.pt"
    saved = load_checkpoint(checkpoint, dev)
    if saved is not None:
        if _without(saved["config"], STOPPING_OPTIONS) != _without(asdict(config), STOPPING_OPTIONS):
            raise GumihoError(f"{checkpoint} was written with other settings; use a new --out or the same options")
        state.resume(saved)
        log.info("resumed at epoch %d, batch %d (step %d)", state.epoch, state.batch, state.step)
    log.info("%s drafter: %d sequences, %d tokens, %d batches/epoch, %d steps, draft vocab %d (covers %.1f%% of "
             "assistant tokens)", config.drafter, len(sequences), sum(len(s.input_ids) for s in sequences),
             len(groups), state.length.steps, drafter.config.draft_vocab_size or target.vocab_size, 100 * coverage)
    if state.length.fixed:
        write_length(out, state.length, len(groups))
    else:  # resumed before the length was fixed: an earlier attempt's file would mislead the waiting script
        (out / "length.json").unlink(missing_ok=True)

    weights = LossWeights(ce=config.ce_weight, mlp_ce=config.mlp_ce_weight, head_feature=config.head_feature_weight,
                          head_ce=config.head_ce_weight)
    generator = torch.Generator(device=dev)
    started = time.time() - state.elapsed
    state.window_from = state.elapsed
    stop_at = config.deadline - started if config.deadline > 0 else math.inf  # in `elapsed` seconds
    while state.epoch < config.epochs and state.step < state.length.steps and state.elapsed < stop_at:
        order = epoch_order(groups, config.seed, state.epoch)
        mlp_ce_on = state.epoch >= config.mlp_ce_epoch
        while state.batch < len(order) and state.step < state.length.steps and state.elapsed < stop_at:
            batch = collate([sequences[i] for i in order[state.batch]], dev)
            generator.manual_seed(config.seed * 1_000_003 + state.step)
            with autocast(dev, config.autocast):
                loss, parts = batch_losses(drafter, batch, weights, config.noise, mlp_ce_on, generator,
                                           config.unroll)
            state.optimize(loss, config.clip_norm)
            state.batch += 1
            state.step += 1
            state.tokens += batch.tokens
            state.elapsed = time.time() - started
            state.window.append(parts)
            if state.step == PROBE_SKIP:
                state.length.probe_from = state.elapsed  # the first steps are slow (allocator, kernels warming up)
            if not state.length.fixed and state.step >= max(config.probe_steps, PROBE_SKIP + 1):
                fix_length(config, state, len(groups))
                write_length(out, state.length, len(groups))
            if state.step % config.log_every == 0 or state.step == state.length.steps:
                if config.minutes > 0 and state.length.fixed and state.step - len(state.window) >= PROBE_SKIP:
                    refit_length(config, state, len(groups), len(state.window))
                    write_length(out, state.length, len(groups))
                log_progress(config, state)
            if state.step % config.checkpoint_every == 0:
                save_checkpoint(checkpoint, config, state)
        if state.batch >= len(order):
            state.epoch += 1
            state.batch = 0
        save_checkpoint(checkpoint, config, state)

    if state.elapsed >= stop_at:
        log.info("stopped at the deadline after %d of %d steps", state.step, state.length.steps)
    state.length.steps = state.step  # a run stopped by its deadline, or a budgeted one that ended before its probe
    write_length(out, state.length, len(groups))
    drafter.save_pretrained(out / "drafter")
    summary = {
        "config": asdict(config),
        "device": _device_name(dev),
        "sequences": len(sequences),
        "tokens_per_epoch": sum(len(s.input_ids) for s in sequences),
        "assistant_tokens_per_epoch": sum(int(s.loss_mask.sum()) for s in sequences),
        "tokens_seen": state.tokens,
        "steps": state.step,
        "epochs_seen": round(state.epoch + state.batch / len(groups), 3),
        "wall_time_s": round(state.elapsed, 1),
        "draft_vocab_size": drafter.config.draft_vocab_size,
        "draft_vocab_coverage": coverage,
        "final": state.history[-1] if state.history else {},
        "history": state.history,
    }
    (out / "train.json").write_text(json.dumps(summary, indent=2) + "\n")
    return out
