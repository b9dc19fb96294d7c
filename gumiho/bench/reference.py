"""The honest baseline: plain `transformers` `model.generate` on the same model, as a user would run it.

A fresh copy of the model in the asked dtype, loaded with no help from the engine (no lean forward, no packed
matmuls), generating greedily (or sampling) from the same prompt ids with the same stop tokens. Its result is
wrapped in a `GenerationTrace` (method "transformers-<dtype>", tau 1) so the bench's rows and tables treat it
like any method.
"""

from __future__ import annotations

import time

import torch
from transformers import AutoModelForCausalLM, PreTrainedModel

from ..engine import sync_device
from ..errors import GumihoError
from ..profile import DTYPES, SHORT
from ..target import Target, model_folder
from ..trace import GenerationTrace, RunSettings

PREFIX = "transformers-"


def reference_name(dtype: str) -> str:
    return PREFIX + SHORT[dtype]


def reference_dtype(name: str) -> str | None:
    """'transformers-bf16' -> 'bfloat16'; None for a name that is not a reference variant."""
    if not name.startswith(PREFIX):
        return None
    return next((d for d, short in SHORT.items() if short == name.removeprefix(PREFIX) and d in DTYPES), None)


def baseline_dtype(target: Target) -> str:
    """The dtype plain transformers runs in to compare with `target`: the target's own, or bf16 for int4 weights
    (transformers has no int4 path on CPU; bf16 is its fastest one-row dtype on CPUs)."""
    return "bfloat16" if target.int4 else target.precision


class TransformersReference:
    """`model.generate` on plain copies of the target's model, one per dtype asked for (loaded on first use).

    `model`: the name or folder the target was loaded from; None reuses the target's own model object in its
    dtype (for models that exist only in memory, as in tests)."""

    def __init__(self, target: Target, model: str | None):
        self.target = target
        self.folder = model_folder(model) if model is not None else None
        self.models: dict[str, PreTrainedModel] = {}
        if self.folder is None:
            self.models[str(target.dtype).removeprefix("torch.")] = target.model

    def model(self, dtype: str) -> PreTrainedModel:
        if dtype not in self.models:
            if self.folder is None:
                raise GumihoError(f"no {dtype} copy of {self.target.name} to compare with")
            lm = AutoModelForCausalLM.from_pretrained(self.folder, dtype=DTYPES[dtype])
            self.models[dtype] = lm.to(self.target.device).eval().requires_grad_(False)
        return self.models[dtype]

    @torch.inference_mode()
    def generate(self, dtype: str, prompt: str, prompt_ids: list[int], max_new_tokens: int, temperature: float,
                 seed: int, chat: bool = True, max_time: float | None = None) -> GenerationTrace:
        """`max_time`: transformers' own wall-clock limit (the app's time budget); None for none."""
        model, device = self.model(dtype), self.target.device
        inputs = torch.tensor([prompt_ids], device=device)
        sampling = {"do_sample": False} if temperature == 0 else {"do_sample": True, "temperature": temperature,
                                                                    "top_p": 1.0, "top_k": 0}
        torch.manual_seed(seed)
        sync_device(device)
        start = time.perf_counter()
        eos = sorted(self.target.eos_ids)
        if not eos:  # stop where the engine stops: nowhere but max_new_tokens
            model.generation_config.eos_token_id = None
        pad = self.target.tokenizer.pad_token_id
        out = model.generate(inputs, attention_mask=torch.ones_like(inputs), max_new_tokens=max_new_tokens,
                             eos_token_id=eos or None, pad_token_id=eos[0] if pad is None and eos else pad or 0,
                             max_time=max_time, **sampling)
        sync_device(device)
        wall = time.perf_counter() - start
        ids = out[0, inputs.shape[1]:].tolist()
        finish = "eos" if ids and ids[-1] in self.target.eos_ids else "length"
        if finish == "length" and len(ids) < max_new_tokens:
            finish = "stopped"  # max_time ran out
        settings = RunSettings(sampling={"temperature": temperature, "top_p": 1.0, "top_k": 0}, tree=None,
                               fta_applied=False, max_new_tokens=max_new_tokens, chat=chat, seed=seed,
                               device=device.type, threads=torch.get_num_threads(), dtype=dtype,
                               forward="transformers")
        return GenerationTrace(method=reference_name(dtype), model=self.target.name, prompt=prompt,
                               prompt_tokens=len(prompt_ids), settings=settings, text=self.target.decode(ids),
                               token_ids=ids, first_token=ids[0] if ids else -1, cycles=max(len(ids) - 1, 0),
                               wall_s=wall, finish_reason=finish)
