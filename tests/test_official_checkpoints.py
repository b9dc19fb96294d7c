"""Loading the papers' own checkpoints (`--drafter`): format detection, shape inference, strict refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from gumiho.__main__ import main
from gumiho.drafters.checkpoint import load_drafter
from gumiho.errors import GumihoError
from gumiho.export import official_state

from .conftest import random_drafter, tiny_target

TARGET = tiny_target(seed=2, vocab=16)
EAGLE_CONFIG = {"architectures": ["LlamaForCausalLM"], "hidden_size": 32, "intermediate_size": 64,
                "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 1, "rms_norm_eps": 1e-6,
                "rope_theta": 10000.0, "vocab_size": 16, "bias": True}


def official_folder(folder: Path, kind: str, *, config: dict | None = None, dtype=torch.float16, drop=(), add=None,
                    file: str = "pytorch_model.bin") -> Path:
    """A checkpoint folder in the official layout, written from a random drafter of ours."""
    state = official_state(random_drafter(kind, TARGET, scale=0.05), TARGET.embed_weight, dtype)
    state = {k: v for k, v in state.items() if k not in drop} | (add or {})
    folder.mkdir(parents=True, exist_ok=True)
    if file.endswith(".safetensors"):
        save_file(state, str(folder / file))
    else:
        torch.save(state, folder / file)
    if config is not None:
        (folder / "config.json").write_text(json.dumps(config))
    return folder


def load(folder, method: str, target=TARGET):
    return load_drafter(str(folder), method, target.embed_weight, target.model.config)


def test_gumiho_without_config_json_is_inferred_from_the_target_and_the_shapes(tmp_path):
    drafter = load(official_folder(tmp_path, "gumiho"), "gumiho")
    c = drafter.config
    assert (c.kind, c.num_layers, c.mlp_heads, c.mlp_blocks, c.num_key_value_heads, c.intermediate_size) == \
        ("gumiho", 2, 5, 5, 2, 64)
    assert c.draft_vocab_size == 0 and drafter.draft_vocab is None
    assert all(p.dtype == torch.float32 for p in drafter.parameters())


@pytest.mark.parametrize("file", ["pytorch_model.bin", "model.safetensors"])
def test_eagle_with_config_json(tmp_path, file):
    drafter = load(official_folder(tmp_path, "eagle2", config=EAGLE_CONFIG, file=file), "eagle2")
    assert (drafter.kind, drafter.config.num_layers, drafter.config.rope_theta) == ("eagle2", 1, 10000.0)


def test_eagle_without_fc_bias(tmp_path):
    folder = official_folder(tmp_path, "eagle2", config=EAGLE_CONFIG | {"bias": False}, drop=["fc.bias"])
    assert not load(folder, "eagle2").transformer.fc.bias.any()


def test_eagle_config_defaults_follow_the_official_econfig(tmp_path):
    config = {k: v for k, v in EAGLE_CONFIG.items() if k not in ("rope_theta", "rms_norm_eps")}
    drafter = load(official_folder(tmp_path, "eagle2", config=config | {"num_key_value_heads": 2}), "eagle2")
    assert (drafter.config.rope_theta, drafter.config.rms_norm_eps) == (10000.0, 1e-6)


def test_a_bf16_checkpoint_with_a_rounded_embedding_copy_loads(tmp_path):
    assert load(official_folder(tmp_path, "gumiho", dtype=torch.bfloat16), "gumiho").kind == "gumiho"


def test_embed_tokens_may_be_left_out(tmp_path):
    assert load(official_folder(tmp_path, "gumiho", drop=["embed_tokens.weight"]), "gumiho").kind == "gumiho"


def test_our_folder_format_still_loads():
    shipped = Path(__file__).resolve().parents[1] / "assets" / "drafters" / "smollm2-135m-eagle2"
    config = json.loads((shipped / "config.json").read_text())
    drafter = load(shipped, "eagle2")  # our format carries its own config: the target is not consulted here
    assert drafter.config.draft_vocab_size == config["draft_vocab_size"]
    with pytest.raises(GumihoError, match="is a eagle2 drafter; it cannot serve method gumiho"):
        load(shipped, "gumiho")


def refused(folder, method: str, match: str, target=TARGET) -> str:
    with pytest.raises(GumihoError, match=match) as info:
        load(folder, method, target)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_another_hidden_size_is_refused_naming_the_tensor_and_both_shapes(tmp_path):
    folder = official_folder(tmp_path, "gumiho")
    small = type(TARGET.model.config)(**(TARGET.model.config.to_dict() | {"hidden_size": 16}))
    with pytest.raises(GumihoError, match=r"fc.weight is \[32, 64\]; a drafter for this target \(hidden size 16\) "
                                          r"needs \[16, 32\]"):
        load_drafter(str(folder), "gumiho", TARGET.embed_weight[:, :16], small)


def test_another_vocabulary_is_refused(tmp_path):
    other = tiny_target(seed=2, vocab=24)
    refused(official_folder(tmp_path / "g", "gumiho"), "gumiho",
            r"embed_tokens.weight is \[16, 32\]; the target's embedding is \[24, 32\]", other)
    refused(official_folder(tmp_path / "e", "eagle2", config=EAGLE_CONFIG), "eagle2",
            r"config.json: vocab_size is 16; the target's is 24", other)


def test_another_models_embedding_is_refused(tmp_path):
    other = tiny_target(seed=7, vocab=16)
    refused(official_folder(tmp_path, "gumiho"), "gumiho", "embed_tokens.weight differs from the target's embedding",
            other)


@pytest.mark.parametrize("kind,drop,add,match", [
    ("gumiho", ["layers.1.input_layernorm.weight"], None, r"missing key\(s\) layers.1.input_layernorm.weight"),
    ("gumiho", ["mlp.4.5.linear.bias"], None, r"missing key\(s\) mlp.4.5.linear.bias"),
    ("gumiho", ["fc.bias"], None, r"missing key\(s\) fc.bias"),
    ("gumiho", [], {"lm_head.weight": torch.zeros(16, 32)}, r"unexpected key\(s\) lm_head.weight"),
    ("gumiho", [], {"layers.0.input_layernorm.weight": torch.ones(32)},
     r"unexpected key\(s\) layers.0.input_layernorm.weight"),
    ("gumiho", [], {"layers.1.self_attn.k_proj.weight": torch.zeros(8, 32)},
     r"layers.1.self_attn.k_proj.weight is \[8, 32\]; this drafter needs \[16, 32\]"),
    ("gumiho", [], {"layers.0.self_attn.k_proj.weight": torch.zeros(12, 32)},
     "cannot tell the attention heads .* add num_attention_heads and num_key_value_heads to its config.json"),
    ("eagle2", [], {"midlayer.hidden_norm.weight": torch.ones(32)}, "EAGLE-3 checkpoint"),
])
def test_strict_keys(tmp_path, kind, drop, add, match):
    refused(official_folder(tmp_path, kind, drop=drop, add=add), kind, match)


def test_eagle_bias_false_with_an_fc_bias_is_refused(tmp_path):
    refused(official_folder(tmp_path, "eagle2", config=EAGLE_CONFIG | {"bias": False}), "eagle2",
            r"unexpected key\(s\) fc.bias")


@pytest.mark.parametrize("field,value", [("num_hidden_layers", 2), ("intermediate_size", 128)])
def test_config_json_that_contradicts_the_weights_is_refused(tmp_path, field, value):
    refused(official_folder(tmp_path, "eagle2", config=EAGLE_CONFIG | {field: value}), "eagle2",
            f"config.json: {field} is {value}; the weights' is")


def test_rope_scaling_is_refused(tmp_path):
    config = EAGLE_CONFIG | {"rope_scaling": {"type": "linear", "factor": 2.0}}
    refused(official_folder(tmp_path, "eagle2", config=config), "eagle2", "rope_scaling .* is not supported")


def test_gumiho_given_as_eagle_and_the_reverse(tmp_path):
    refused(official_folder(tmp_path / "g", "gumiho"), "eagle2",
            r"is an official Gumiho checkpoint \(it has MLP heads \(mlp.\*\)\); use it with --method gumiho")
    refused(official_folder(tmp_path / "e", "eagle2", config=EAGLE_CONFIG), "gumiho",
            "is an official EAGLE checkpoint .* use it with --method eagle2")


@pytest.mark.parametrize("content,match", [
    (b"not a checkpoint at all", "is not a state dict file"),
    ([torch.zeros(2)], "is not a state dict: it holds a list"),
    ({"fc.weight": [1, 2]}, "entry 'fc.weight' holds a list"),
    ({"model": {"fc.weight": torch.zeros(2)}}, "entry 'model' holds a dict"),
    (Path("x"), "is not a state dict file"),  # pickled non-tensor class: refused by weights_only=True
])
def test_a_file_that_is_not_a_state_dict(tmp_path, content, match):
    file = tmp_path / "pytorch_model.bin"
    if isinstance(content, bytes):
        file.write_bytes(content)
    else:
        torch.save(content, file)
    refused(tmp_path, "gumiho", match)


def test_missing_folders_and_hub_ids_without_network(tmp_path):
    refused(tmp_path / "nope" / "deeper", "gumiho", "drafter .*deeper does not exist")
    refused(tmp_path, "gumiho", "is not a drafter folder: it holds neither")
    message = refused("gumiho-tests-nobody/no-such-drafter", "gumiho", "could not be fetched from the Hugging Face Hub")
    assert message.startswith("drafter gumiho-tests-nobody/no-such-drafter is not a local folder")


def test_a_checkpoint_file_can_be_named_directly(tmp_path):
    folder = official_folder(tmp_path, "eagle2", config=EAGLE_CONFIG)
    assert load(folder / "pytorch_model.bin", "eagle2").kind == "eagle2"


def test_generate_with_official_checkpoints_is_exact(tmp_path, capsys, monkeypatch):
    """In fp32: this model's head size (8) takes SDPA, with which the int4 path is equal to AR only up to the
    rounding of its products' inputs (tests/test_int4.py covers the int4 path with the row-consistent attention)."""
    from gumiho import profile

    monkeypatch.setattr(profile, "profile_path", lambda target: tmp_path / "profile.json")  # not the user's cache
    TARGET.model.save_pretrained(tmp_path / "model")
    TARGET.tokenizer.save_pretrained(tmp_path / "model")
    folders = {"gumiho": official_folder(tmp_path / "g", "gumiho"),
               "eagle2": official_folder(tmp_path / "e", "eagle2", config=EAGLE_CONFIG, file="model.safetensors")}
    outputs = {}
    for method in ("ar", "gumiho", "eagle2"):
        extra = ["--drafter", str(folders[method])] if method != "ar" else []
        code = main(["generate", "--model", str(tmp_path / "model"), "--method", method, *extra, "--device", "cpu",
                     "--prompt", "w1 w2 w3 w4", "--no-chat", "--max-new-tokens", "16", "--json", "--no-fta",
                     "--dtype", "float32"])
        out, err = capsys.readouterr()
        assert code == 0, err
        record = json.loads(out)
        assert record["new_tokens"] == 16
        outputs[method] = record["token_ids"]
        if method != "ar":
            assert record["drafter"] == str(folders[method])
    assert outputs["gumiho"] == outputs["ar"] == outputs["eagle2"]
