"""Run the methods back to back on every prompt and collect one row per (prompt, method).

Interleaving: for each prompt (and temperature / seed) every variant runs once before the next prompt starts, in
an order rotated from prompt to prompt, so slow drift of a shared machine hits all methods alike and no method
always goes first. All methods share one process, so one thread count and one copy of the target.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

import pandas as pd
from tqdm import tqdm

from ..engine import Engine, GenerationConfig
from ..errors import GumihoError
from ..sampling import SamplingConfig
from ..trace import DRAFTED_METHODS, CycleTrace, GenerationTrace
from ..tree import TreeSettings
from .datasets import DEFAULT_DIR, Question, encode_conversation, load_questions
from .journal import JobKey
from ..perplexity import perplexity
from .metrics import prompt_row
from .reference import LLAMA_CPP, References, is_reference, reference_name

REFERENCES = ("transformers", "transformers-fp32", "transformers-bf16", "transformers-fp16", LLAMA_CPP)
DRAFTED = DRAFTED_METHODS  # the papers' order, the lossy MJSD after them, then the draft-free lookup and recycle
DEFAULT_VARIANTS = ("transformers", "ar", *(v for m in DRAFTED for v in ((m, "gumiho+fta") if m == "gumiho" else (m,))))
VARIANTS = (*DEFAULT_VARIANTS, *REFERENCES[1:])


@dataclass(frozen=True)
class Variant:
    """A method with a fixed tree: `gumiho+fta` is Gumiho with Full Tree Attention on (greedy runs only);
    `transformers-<dtype>` is plain `model.generate` in that dtype, `llama.cpp` llama.cpp on the embedded model's
    GGUF file (`reference.py`)."""

    name: str
    method: str
    tree: TreeSettings | None

    def to_dict(self) -> dict:
        return {"name": self.name, "method": self.method, "tree": self.tree.to_dict() if self.tree else None}


def make_variants(names: list[str], trees: dict[str, TreeSettings], dtype: str = "float32") -> list[Variant]:
    """`trees` maps each drafted method to its tree; FTA is switched on for `gumiho+fta` only. "transformers" is
    the reference in the engine's `dtype`. Variants come in VARIANTS' order (the papers')."""
    variants = []
    for name in sorted(names, key=lambda n: VARIANTS.index(n) if n in VARIANTS else -1):
        if name not in VARIANTS:
            raise GumihoError(f"unknown method {name!r}; choose from {', '.join(VARIANTS)}")
        if name == "transformers":
            name = reference_name(dtype)
        if is_reference(name):
            if name not in [v.name for v in variants]:
                variants.append(Variant(name, name, None))
            continue
        method = name.split("+")[0]
        tree = None if method == "ar" else replace(trees[method], fta=name.endswith("+fta"))
        if tree is not None:
            tree.validate(method)
        variants.append(Variant(name, method, tree))
    return variants


@dataclass
class BenchSettings:
    datasets: list[str]
    data_dir: Path = DEFAULT_DIR
    limit: int | None = None
    max_new_tokens: int = 256
    temperatures: tuple[float, ...] = (0.0,)
    seeds: tuple[int, ...] = (0,)
    warmup: int = 1
    both_turns: bool = False

    def to_dict(self) -> dict:
        return {"datasets": self.datasets, "data_dir": str(self.data_dir), "limit": self.limit,
                "max_new_tokens": self.max_new_tokens, "temperatures": list(self.temperatures),
                "seeds": list(self.seeds), "warmup": self.warmup, "both_turns": self.both_turns}

    def turns(self, question: Question) -> list[str]:
        return question.turns if self.both_turns else question.turns[:1]

    def runs(self) -> list[tuple[float, int]]:
        """(temperature, seed) pairs; greedy decoding ignores the seed, so T = 0 runs once, with the first seed."""
        return [(t, s) for t in self.temperatures for s in (self.seeds[:1] if t == 0 else self.seeds)]


def active(variants: list[Variant], temperature: float) -> list[Variant]:
    """FTA only changes greedy decoding: at T > 0 `gumiho+fta` would repeat `gumiho`, so it is skipped."""
    return [v for v in variants if temperature == 0 or not (v.tree and v.tree.fta)]


def generate(engine: Engine, variant: Variant, text: str, prompt_ids: list[int] | None, max_new_tokens: int,
             temperature: float, seed: int, reference: References | None = None
             ) -> tuple[GenerationTrace, list[CycleTrace]]:
    if is_reference(variant.method):
        if reference is None:
            raise GumihoError(f"{variant.name} runs outside the engine: the bench needs its References")
        ids = prompt_ids or engine.target.encode_prompt(text)
        return reference.generate(variant.method, text, ids, max_new_tokens, temperature, seed), []
    config = GenerationConfig(max_new_tokens=max_new_tokens, sampling=SamplingConfig(temperature=temperature),
                              seed=seed, trace=False, tree=variant.tree)
    run = engine.run(text, variant.method, config, prompt_ids=prompt_ids)
    cycles = list(run)
    return run.trace, cycles


def warm_up(engine: Engine, variants: list[Variant], question: Question, settings: BenchSettings,
            reference: References | None = None) -> None:
    temperature, seed = settings.runs()[0]
    for _ in range(settings.warmup):
        for variant in active(variants, temperature):
            generate(engine, variant, question.turns[0], None, settings.max_new_tokens, temperature, seed, reference)


def run_conversation(engine: Engine, variants: list[Variant], question: Question, temperature: float, seed: int,
                     settings: BenchSettings, slot: int, bar: tqdm,
                     reference: References | None = None) -> list[dict]:
    """Every variant on each turn of one question; the variant order is rotated by `slot`."""
    chosen = active(variants, temperature)
    order = chosen[slot % len(chosen):] + chosen[: slot % len(chosen)]
    key = {"dataset": question.dataset, "question_id": question.question_id, "temperature": temperature, "seed": seed}
    rows, history = [], []
    for turn, text in enumerate(settings.turns(question), 1):
        ids = encode_conversation(engine.target.tokenizer, history + [text]) if history else None
        results = {}
        for variant in order:
            bar.set_postfix_str(f"{question.dataset} {variant.name}")
            results[variant.name] = generate(engine, variant, text, ids, settings.max_new_tokens, temperature, seed,
                                             reference)
            bar.update()
        reference = results["ar"][0] if "ar" in results and temperature == 0 else None
        prompt_ids = ids or engine.target.encode_prompt(text)
        for variant in chosen:
            trace, cycles = results[variant.name]
            ref = reference if variant.name != "ar" else None
            quality = perplexity(engine.target, prompt_ids, trace.token_ids) if trace.token_ids else None
            rows.append({**key, "turn": turn, "method": variant.name, **prompt_row(trace, cycles, ref, quality)})
        # The next turn follows AR's answer (the first variant's without AR), the same for every method.
        history += [text, results.get("ar", results[chosen[0].name])[0].text]
    return rows


def run_bench(engine: Engine, variants: list[Variant], settings: BenchSettings, progress: bool = True,
              done: dict[JobKey, list[dict]] | None = None,
              on_job: Callable[[JobKey, list[dict]], None] | None = None,
              reference: References | None = None) -> pd.DataFrame:
    """Warm up on the first question, then run every variant on every prompt; returns the per-prompt table.

    `done` holds the rows of conversations finished earlier (a resumed run): they are not run again. `on_job` is
    called with each newly finished conversation's key and rows (to journal them)."""
    done = done or {}
    questions = [q for name in settings.datasets for q in load_questions(name, settings.data_dir, settings.limit)]
    jobs = [((q.dataset, q.question_id, t, s), q) for q in questions for t, s in settings.runs()]
    size = {key: len(settings.turns(q)) * len(active(variants, key[2])) for key, q in jobs}
    rows: list[dict] = []
    with tqdm(total=sum(size.values()), initial=sum(size[k] for k in size if k in done), desc="bench", unit="gen",
              disable=not progress) as bar:
        if any(key not in done for key, _ in jobs):
            warm_up(engine, variants, questions[0], settings, reference)
        for slot, (key, question) in enumerate(jobs):  # the slot (variant order) does not depend on resuming
            if key in done:
                rows.extend(done[key])
                continue
            new = run_conversation(engine, variants, question, key[2], key[3], settings, slot, bar, reference)
            if on_job:
                on_job(key, new)
            rows.extend(new)
    return pd.DataFrame(rows)
