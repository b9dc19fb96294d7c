"""The shipped SmolLM2-135M drafters: files, shapes that fit the default target, and real speculation."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open

from gumiho.drafters import Drafter
from gumiho.drafters.frequency import FREQUENT_DRAFT_VOCAB
from gumiho.engine import GenerationConfig
from gumiho.loader import SHIPPED, load_drafters
from gumiho.profile import drafter_key
from gumiho.target import DEFAULT_MODEL

# SmolLM2-135M-Instruct (its config.json): the shape every drafter for it must have.
DEFAULT_SHAPE = {"hidden_size": 576, "intermediate_size": 1536, "num_attention_heads": 9, "num_key_value_heads": 3,
                 "vocab_size": 49152, "rope_theta": 100000.0}
LAYERS = {"medusa": 0, "hydra": 0, "eagle2": 1, "gumiho": 2}
# tau floors on one prompt: a random drafter stays at ~1.0 (nothing accepted); the shipped Transformer drafters
# average ~2 on MT-Bench, the shipped heads less (see their model cards)
TAU_FLOOR = {"medusa": 1.2, "hydra": 1.2, "eagle2": 1.5, "gumiho": 1.5}


def _folder(kind: str):
    folder = SHIPPED[DEFAULT_MODEL][kind]
    if not (folder / "model.safetensors").is_file():
        pytest.skip(f"{folder} is not shipped yet")
    return folder


@pytest.mark.parametrize("kind", list(LAYERS))
def test_shipped_drafter_files_fit_the_default_target(kind):
    folder = _folder(kind)
    config = json.loads((folder / "config.json").read_text())
    assert config["kind"] == kind and config["num_layers"] == LAYERS[kind]
    assert {k: config[k] for k in DEFAULT_SHAPE} == DEFAULT_SHAPE
    assert (folder / "README.md").read_text().count("Tokens seen") == 1
    assert (folder / "model.safetensors").stat().st_size < 45e6
    with safe_open(str(folder / "model.safetensors"), framework="pt") as f:
        keys = list(f.keys())
        assert all(f.get_tensor(k).dtype in (torch.float16, torch.int64) for k in keys)
    assert not [k for k in keys if "embed" in k or "lm_head" in k]  # the target's weights are never copied

    drafter = Drafter.from_pretrained(folder)
    vocab = drafter.draft_vocab
    assert vocab is not None and len(set(vocab.tolist())) == vocab.numel() == config["draft_vocab_size"]
    assert 0 <= int(vocab.min()) and int(vocab.max()) < DEFAULT_SHAPE["vocab_size"] and 2 in vocab.tolist()
    shared = torch.zeros(DEFAULT_SHAPE["vocab_size"], DEFAULT_SHAPE["hidden_size"])
    drafter.attach(shared, shared)  # raises if the shapes do not fit
    assert drafter.head_weight.shape == (vocab.numel(), DEFAULT_SHAPE["hidden_size"])
    # Their ranking (python -m gumiho.train frequency): every id counted in ShareGPT's replies but a few
    assert drafter.vocab_counts is not None and drafter.vocab_counts.shape == vocab.shape
    assert (drafter.vocab_counts > 0).float().mean() > 0.95


@pytest.mark.slow
@pytest.mark.parametrize("kind", list(LAYERS))
def test_shipped_drafters_propose_from_their_most_frequent_ids(smollm, kind):
    _folder(kind)
    drafter, shipped = smollm.drafters[kind], Drafter.from_pretrained(_folder(kind))
    assert drafter.config.draft_vocab_size == FREQUENT_DRAFT_VOCAB == drafter.draft_vocab.numel()
    assert smollm.target.tokenizer.convert_tokens_to_ids("<|im_end|>") in drafter.draft_vocab.tolist()
    rare = shipped.draft_vocab[shipped.vocab_counts < drafter.vocab_counts.min()]
    assert rare.numel() > 0 and not torch.isin(rare, drafter.draft_vocab).any()
    # Loaded trimmed, so that the machine profile times (and keys) the draft the engine will run
    loaded, _ = load_drafters(smollm.target, None, {kind: None})[kind]
    assert f":v{FREQUENT_DRAFT_VOCAB}:" in drafter_key(loaded)


@pytest.mark.slow
@pytest.mark.parametrize("kind", list(LAYERS))
def test_shipped_drafter_speculates_on_the_default_target(smollm, kind):
    _folder(kind)
    assert smollm.drafter_names[kind].endswith(f"smollm2-135m-{kind}")
    trace = smollm.generate("Explain what a computer network is.", kind,
                            GenerationConfig(max_new_tokens=48, trace=False))
    assert trace.tau > TAU_FLOOR[kind]
