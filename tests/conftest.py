"""Shared fixtures: a tiny random Llama target (real transformers model, real tokenizer) and random drafters."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from gumiho.drafters import Drafter, new_drafter
from gumiho.engine import Engine
from gumiho.target import Target


# The tiny-model tests run on the CPU in fp32 unless these name another device and dtype: the CUDA subset is
# `GUMIHO_TEST_DEVICE=cuda GUMIHO_TEST_DTYPE=float16 pytest tests/test_exactness.py` (docs/benchmarks.md#cuda-tests).
TEST_DEVICE = torch.device(os.environ.get("GUMIHO_TEST_DEVICE", "cpu"))
TEST_DTYPE = getattr(torch, os.environ.get("GUMIHO_TEST_DTYPE", "float32"))


def tiny_tokenizer(vocab: int) -> PreTrainedTokenizerFast:
    words = {f"w{i}": i for i in range(vocab)}
    tok = Tokenizer(models.WordLevel(vocab=words, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="w0")


def tiny_target(seed: int = 0, vocab: int = 16, layers: int = 2, logit_scale: float = 4.0,
                hidden: int = 32) -> Target:
    """A 2-layer random Llama (hidden 32, GQA 4/2 heads; `hidden` 256: heads of 64 dimensions). `logit_scale`
    sharpens its distributions so that greedy argmaxes are far from ties and random drafts are accepted often enough
    to exercise multi-token acceptance."""
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512, rope_theta=10000.0,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(logit_scale / (model.lm_head.weight.std() * hidden**0.5))
    model.requires_grad_(False)
    model.to(TEST_DEVICE, TEST_DTYPE)  # built on the CPU first, so every device gets the same weights
    return Target(model=model, tokenizer=tiny_tokenizer(vocab), name=f"tiny-{seed}", device=TEST_DEVICE,
                  dtype=TEST_DTYPE, eos_ids=set())


@pytest.fixture(scope="session", autouse=True)
def own_measurements(tmp_path_factory: pytest.TempPathFactory):
    """The suite's machine profiles and prefill choices in a folder of its own, measured afresh: made under a test
    run's load and kept in the user's cache, they would decide the app's later runs (a prefill choice measured while
    two suites ran kept SDPA's attention where the AMX tiles take half its time). Everything else in the cache (built
    kernels, the converted default model) is shared, linked."""
    from gumiho.target import cache_root

    user, own = cache_root(), tmp_path_factory.mktemp("gumiho-cache")
    user.mkdir(parents=True, exist_ok=True)
    (user / "kernels").mkdir(exist_ok=True)
    for entry in user.iterdir():
        if entry.name != "profiles":
            (own / entry.name).symlink_to(entry, target_is_directory=entry.is_dir())
    previous = os.environ.get("GUMIHO_CACHE")
    os.environ["GUMIHO_CACHE"] = str(own)  # subprocesses (the app, the CLI) inherit it
    yield own
    if previous is None:
        del os.environ["GUMIHO_CACHE"]
    else:
        os.environ["GUMIHO_CACHE"] = previous


def use_cache(monkeypatch: pytest.MonkeyPatch, folder: Path) -> Path:
    """`folder` as GUMIHO_CACHE (profiles, converted models, prefill choices start empty) sharing the suite's built
    kernels: a kernel builds in about 40 s on a 2-core machine, which a run inside its time budget must not include."""
    from gumiho.kernels import kernel_root

    built = kernel_root()
    built.mkdir(parents=True, exist_ok=True)
    monkeypatch.setenv("GUMIHO_CACHE", str(folder))
    kernel_root().parent.mkdir(parents=True, exist_ok=True)
    kernel_root().symlink_to(built, target_is_directory=True)
    return folder


# The methods a tiny engine has drafters for (lookup and recycle have no weights).
DRAFTED = ("medusa", "hydra", "eagle1", "eagle2", "gumiho", "lookup", "recycle")


def random_drafter(kind: str, target: Target, seed: int = 0, scale: float = 0.3) -> Drafter:
    """A drafter with every weight random (the MLP heads too, which start at zero), so trees vary from cycle to cycle."""
    drafter = new_drafter(kind, target.model.config, seed=seed)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in drafter.parameters():
            p.copy_(torch.randn(p.shape, generator=generator) * scale)
    return drafter


def tiny_engine(seed: int = 0, vocab: int = 16, drafter_seed: int = 0) -> Engine:
    target = tiny_target(seed, vocab)
    engine = Engine(target)
    for kind in DRAFTED:
        engine.add_drafter(kind, random_drafter(kind, target, drafter_seed))
    return engine


@pytest.fixture(scope="session")
def smollm():
    """The real default engine (SmolLM2-135M-Instruct with the shipped drafters, or random ones until they exist)."""
    from gumiho.loader import build_engine

    return build_engine(threads=2, dtype="float32", trees="default")  # exactness tests compare against fp32 AR
