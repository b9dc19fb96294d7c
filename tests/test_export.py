"""`python -m gumiho export`: our drafters in the official formats, and back (round trip)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from gumiho.__main__ import main
from gumiho.drafters import Drafter, new_drafter
from gumiho.drafters.checkpoint import load_drafter
from gumiho.export import export_drafter
from gumiho.tree import TreeSettings

from .conftest import tiny_target
from .official_reference import econfig, gumiho_args, load_checkpoint_state, official_modules

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "assets" / "drafters"
TREES = {"gumiho": TreeSettings(top_k=4, depth=6, total_tokens=20, mlptopk=3, pruning=5),
         "eagle2": TreeSettings(top_k=4, depth=5, total_tokens=20)}


def restricted_drafter(kind: str, target, seed: int = 0) -> Drafter:
    """A random drafter whose draft vocabulary is half the target's, in a shuffled order."""
    drafter = new_drafter(kind, target.model.config, seed=seed, draft_vocab_size=target.vocab_size // 2)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in drafter.parameters():
            p.copy_(torch.randn(p.shape, generator=generator) / (p.shape[-1] ** 0.5 if p.dim() > 1 else 10))
        drafter.draft_vocab.copy_(torch.randperm(target.vocab_size, generator=generator)[: target.vocab_size // 2])
    return drafter


def drafts(drafter: Drafter, target, tree: TreeSettings, cycles: int = 2) -> list[tuple[list, list, list]]:
    """The candidate pools (tokens, parents, scores) drafted over a few cycles of one fixed sequence."""
    ids = torch.randint(0, target.vocab_size, (14,), generator=torch.Generator().manual_seed(9))
    features = target.features(ids, target.new_cache())
    drafter.reset()
    pools, bounds = [], [0, 8, 11, 13][: cycles + 1]
    for start, end in zip(bounds, bounds[1:]):
        pool = drafter.propose(features[start:end], ids[start + 1:end + 1], tree)
        pools.append(tuple(torch.cat(getattr(pool, f)).tolist() for f in ("tokens", "parents", "scores")))
    return pools


def full_vocab_copy(drafter: Drafter) -> Drafter:
    copy = Drafter.from_config(type(drafter.config)(**vars(drafter.config)))
    copy.load_state_dict(drafter.state_dict())
    return copy.use_full_vocab()


@pytest.mark.parametrize("kind,fmt", [("gumiho", "official"), ("eagle2", "official"), ("eagle2", "eagle")])
def test_round_trip_gives_the_full_vocabulary_drafts(tmp_path, kind, fmt):
    target = tiny_target(seed=3, vocab=32)
    ours = restricted_drafter(kind, target)
    out = export_drafter(ours, target.embed_weight, target.max_context, fmt, tmp_path / "out", torch.float32)
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "pytorch_model.bin"]
    config = json.loads((out / "config.json").read_text())
    assert config["num_hidden_layers"] == (2 if kind == "gumiho" else 1) and config["bias"] is True
    state = torch.load(out / "pytorch_model.bin", weights_only=True)
    assert "draft_vocab" not in state and torch.equal(state["embed_tokens.weight"], target.embed_weight)
    assert ("mlp.4.5.linear.weight" in state) == (kind == "gumiho") and "layers.0.input_layernorm.weight" not in state

    loaded = load_drafter(str(out), kind, target.embed_weight, target.model.config)
    full = full_vocab_copy(ours)
    for d in (loaded, full, ours):
        d.attach(target.embed_weight, target.head_weight)
    assert drafts(loaded, target, TREES[kind]) == drafts(full, target, TREES[kind])
    assert drafts(ours, target, TREES[kind]) != drafts(full, target, TREES[kind])  # the restriction is what changed


def test_fp16_export(tmp_path):
    target = tiny_target(seed=3, vocab=32)
    ours = restricted_drafter("gumiho", target)
    out = export_drafter(ours, target.embed_weight, target.max_context, "official", tmp_path / "out")
    state = torch.load(out / "pytorch_model.bin", weights_only=True)
    assert {v.dtype for v in state.values()} == {torch.float16}
    assert json.loads((out / "config.json").read_text())["torch_dtype"] == "float16"
    loaded = load_drafter(str(out), "gumiho", target.embed_weight, target.model.config)
    torch.testing.assert_close(loaded.heads.in_weight, ours.heads.in_weight.half().float())


@pytest.mark.filterwarnings("ignore:`rope_scaling` is deprecated:FutureWarning")
@pytest.mark.parametrize("kind", ["gumiho", "eagle2"])
def test_the_official_modules_load_the_export_strictly(tmp_path, kind):
    official = official_modules()
    target = tiny_target(seed=3, vocab=32)
    ours = restricted_drafter(kind, target)
    out = export_drafter(ours, target.embed_weight, target.max_context, "official", tmp_path / "out", torch.float32)
    state = torch.load(out / "pytorch_model.bin", weights_only=True)
    if kind == "gumiho":
        theirs = official.gumiho.Model(econfig(official, target, 2), args=gumiho_args())
    else:
        config = official.EConfig.from_pretrained(out)
        config.rope_scaling = None
        theirs = official.eagle.Model(config, bias=json.loads((out / "config.json").read_text())["bias"])
    load_checkpoint_state(theirs, state)
    theirs.eval()
    ids = torch.randint(0, 32, (6,), generator=torch.Generator().manual_seed(1))
    features = target.features(ids, target.new_cache()).clone()
    with torch.no_grad():
        extra = {"mode": "gumiho_generate"} if kind == "gumiho" else {}
        expected = theirs(features[None, :5], input_ids=ids[None, 1:], **extra)[0]
        ours.attach(target.embed_weight, target.head_weight)
        got = ours.transformer(ours.transformer.fuse(ours.embed(ids[1:]), features[:5])[None], torch.arange(5))[0]
    torch.testing.assert_close(got, expected, atol=2e-5, rtol=1e-4)


def run_export(capsys, *args: str) -> tuple[int, str]:
    try:
        code = main(["export", *args])
    except SystemExit as exc:  # argparse's usage errors
        code = exc.code
    return code, capsys.readouterr().err


@pytest.mark.parametrize("args,message", [
    (["--format", "official", "--out", "x"], "the following arguments are required: --drafter"),
    (["--drafter", str(SHIPPED / "smollm2-135m-gumiho"), "--format", "onnx", "--out", "x"], "invalid choice: 'onnx'"),
    (["--drafter", "/no/such/drafter", "--format", "official", "--out", "x"], "is not a drafter folder"),
    (["--drafter", str(SHIPPED / "smollm2-135m-gumiho"), "--format", "eagle", "--out", "x"],
     "the eagle format holds EAGLE-2 drafters; this is a gumiho drafter (use --format official)"),
    (["--drafter", str(SHIPPED / "smollm2-135m-eagle2"), "--format", "eagle", "--out", str(ROOT / "gumiho")],
     "already exists and is not an empty folder"),
])
def test_bad_input_is_one_line_and_exit_status_2(capsys, args, message):
    code, err = run_export(capsys, *args)
    assert code == 2 and message in err and err.count("\n") == 1, err


@pytest.mark.slow
@pytest.mark.parametrize("kind,fmt", [("gumiho", "official"), ("eagle2", "eagle")])
def test_shipped_drafters_export_and_load_back(capsys, tmp_path, smollm, kind, fmt):
    code, err = run_export(capsys, "--drafter", str(SHIPPED / f"smollm2-135m-{kind}"), "--format", fmt,
                           "--out", str(tmp_path / "out"))
    assert code == 0, err
    assert "the draft vocabulary (16384 of 49152 tokens) is dropped" in err
    target = smollm.target
    loaded = load_drafter(str(tmp_path / "out"), kind, target.embed_weight, target.model.config)
    full = Drafter.from_pretrained(SHIPPED / f"smollm2-135m-{kind}").use_full_vocab()
    for d in (loaded, full):
        d.attach(target.embed_weight, target.head_weight)
    assert drafts(loaded, target, TREES[kind], cycles=1) == drafts(full, target, TREES[kind], cycles=1)
