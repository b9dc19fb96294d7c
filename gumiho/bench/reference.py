"""The honest baselines: what a user would otherwise run on the same model.

- plain `transformers` `model.generate`: a fresh copy of the model in the asked dtype, loaded with no help from the
  engine (no lean forward, no packed matmuls);
- llama.cpp (`llama-cpp-python`, optional: where `llama_cpp` imports) on the GGUF file the embedded model is read
  from, the same Q4_1 weights the int4 path multiplies by.

Each generates greedily (or samples) from the same prompt ids with the same stop tokens, and its result is wrapped
in a `GenerationTrace` (method "transformers-<dtype>" or "llama.cpp", tau 1), so the bench's rows and tables treat
it like any method.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from functools import lru_cache
from pathlib import Path
from typing import Callable

import torch
from transformers import AutoModelForCausalLM, PreTrainedModel

from ..engine import sync_device
from ..errors import GumihoError
from ..profile import DTYPES, SHORT
from ..target import DEFAULT_MODEL, Target, find_default_gguf, model_folder
from ..trace import GenerationTrace, RunSettings

PREFIX = "transformers-"
LLAMA_CPP = "llama.cpp"


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
        return _trace(self.target, reference_name(dtype), "transformers", dtype, prompt, prompt_ids,
                      out[0, inputs.shape[1]:].tolist(), wall, max_new_tokens, temperature, seed, chat)


def _trace(target: Target, method: str, forward: str, dtype: str, prompt: str, prompt_ids: list[int],
           ids: list[int], wall: float, max_new_tokens: int, temperature: float, seed: int,
           chat: bool) -> GenerationTrace:
    finish = "eos" if ids and ids[-1] in target.eos_ids else "length"
    if finish == "length" and len(ids) < max_new_tokens:
        finish = "stopped"  # a time limit ran out
    settings = RunSettings(sampling={"temperature": temperature, "top_p": 1.0, "top_k": 0}, tree=None,
                           fta_applied=False, max_new_tokens=max_new_tokens, chat=chat, seed=seed,
                           device=target.device.type, threads=torch.get_num_threads(), dtype=dtype, forward=forward)
    return GenerationTrace(method=method, model=target.name, prompt=prompt, prompt_tokens=len(prompt_ids),
                           settings=settings, text=target.decode(ids), token_ids=ids,
                           first_token=ids[0] if ids else -1, cycles=max(len(ids) - 1, 0), wall_s=wall,
                           finish_reason=finish)


@lru_cache(maxsize=None)
def llama_cpp_available() -> bool:
    """Whether `llama_cpp` imports (installed without its dependencies, it is found but fails to import)."""
    try:
        import llama_cpp  # noqa: F401
    except Exception:  # ImportError, or its native library failing to load
        return False
    return True


# Two greedy tokens through llama.cpp in a child process: argv[1] the GGUF file, argv[2] the threads.
PROBE = """
import sys
from llama_cpp import Llama
threads = int(sys.argv[2])
llm = Llama(model_path=sys.argv[1], n_ctx=64, n_threads=threads, n_threads_batch=threads, verbose=False)
for _, _ in zip(range(2), llm.generate([1, 2, 3, 4], temp=0.0, top_k=1, top_p=1.0, min_p=0.0, repeat_penalty=1.0)):
    pass
"""
AMX_HINT = ('rebuild llama-cpp-python without its AMX code: CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX2=ON '
            '-DGGML_AVX512=ON" pip install --force-reinstall --no-cache-dir llama-cpp-python')


def probe_llama_cpp(gguf: Path, run: Callable[..., subprocess.CompletedProcess] = subprocess.run) -> str | None:
    """None where llama.cpp generates two tokens from `gguf` in a child process, else why not. A build can die
    in the middle of a product (llama-cpp-python 0.3.36 built for the processor, on an Intel Xeon with AMX in a
    VM: SIGILL at its first AMX tile instruction), which would take the whole bench down with it."""
    try:
        done = run([sys.executable, "-c", PROBE, str(gguf), str(torch.get_num_threads())], capture_output=True,
                   text=True, timeout=300)
    except subprocess.TimeoutExpired:
        return "llama.cpp did not generate two tokens in 5 minutes"
    if done.returncode == 0:
        return None
    if done.returncode < 0:  # SIGILL (4): an instruction this machine will not run, as its AMX code above
        hint = f"; {AMX_HINT}" if done.returncode == -signal.SIGILL else ""
        return f"llama.cpp died on a two-token probe (signal {-done.returncode}){hint}"
    last = (done.stderr or done.stdout or "").strip().splitlines()[-1:] or [f"exit status {done.returncode}"]
    return f"llama.cpp failed on a two-token probe: {last[0]}"


@lru_cache(maxsize=None)
def llama_cpp_problem() -> str | None:
    """Why the llama.cpp row cannot run on this machine, or None (measured once per process)."""
    if not llama_cpp_available():
        return "the llama.cpp row needs llama-cpp-python (optional: pip install llama-cpp-python)"
    try:
        return probe_llama_cpp(find_default_gguf())
    except GumihoError as error:
        return str(error)


def check_llama_cpp(model: str | None) -> None:
    """Raise a one-line error where the llama.cpp row cannot run: a model without our GGUF, no `llama_cpp`, or a
    llama.cpp that dies on this machine."""
    if model not in (None, DEFAULT_MODEL):
        raise GumihoError(f"the llama.cpp row runs the embedded model's GGUF file only, not {model!r}")
    problem = llama_cpp_problem()
    if problem:
        raise GumihoError(problem)


class LlamaCppReference:
    """llama.cpp on the embedded model's GGUF file (loaded on first use), as many threads as the engine. Greedy at
    T = 0; at T > 0 its sampler with temperature alone (top-k, top-p and min-p off). The prompt ids are the
    engine's own (chat template included), so every row reads the same prompt."""

    def __init__(self, target: Target):
        self.target = target
        self._llm = None

    @property
    def llm(self):
        if self._llm is None:
            from llama_cpp import Llama

            self._llm = Llama(model_path=str(find_default_gguf()), n_ctx=self.target.max_context,
                              n_threads=torch.get_num_threads(), n_threads_batch=torch.get_num_threads(),
                              verbose=False)
        return self._llm

    def generate(self, prompt: str, prompt_ids: list[int], max_new_tokens: int, temperature: float,
                 seed: int, chat: bool = True) -> GenerationTrace:
        llm, ids = self.llm, []
        llm.set_seed(seed)
        start = time.perf_counter()
        for token in llm.generate(prompt_ids, temp=temperature, top_k=1 if temperature == 0 else 0, top_p=1.0,
                                  min_p=0.0, repeat_penalty=1.0, reset=True):
            ids.append(int(token))
            if ids[-1] in self.target.eos_ids or len(ids) >= max_new_tokens:
                break
        return _trace(self.target, LLAMA_CPP, "llama.cpp", "Q4_1 GGUF", prompt, prompt_ids, ids,
                      time.perf_counter() - start, max_new_tokens, temperature, seed, chat)


def is_reference(name: str) -> bool:
    return name == LLAMA_CPP or reference_dtype(name) is not None


class References:
    """The bench's rows that run outside the engine, by variant name, each loaded on first use."""

    def __init__(self, target: Target, model: str | None):
        self.target, self.model = target, model
        self._transformers: TransformersReference | None = None
        self._llama: LlamaCppReference | None = None

    def generate(self, name: str, prompt: str, prompt_ids: list[int], max_new_tokens: int, temperature: float,
                 seed: int) -> GenerationTrace:
        if name == LLAMA_CPP:
            self._llama = self._llama or LlamaCppReference(self.target)
            return self._llama.generate(prompt, prompt_ids, max_new_tokens, temperature, seed)
        self._transformers = self._transformers or TransformersReference(self.target, self.model)
        return self._transformers.generate(reference_dtype(name), prompt, prompt_ids, max_new_tokens, temperature,
                                           seed)
