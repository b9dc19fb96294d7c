"""Load the drafter named by `--drafter`: a local folder or a Hub id, in our format or an official one.

The folder's files decide the format: our `config.json` (it has a "kind") + `model.safetensors`, or an official
checkpoint, `pytorch_model.bin` or `model.safetensors` with an optional Llama-style `config.json` (see
`official.py`). Official weights are read with `torch.load(weights_only=True)`, never by unpickling code.
"""

from __future__ import annotations

import json
import pickle
import re
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from ..errors import GumihoError
from .base import Drafter
from .official import EMBED, KIND_NAMES, OfficialCheckpoint, check_keys, infer_config, to_ours

HUB_ID = re.compile(r"[\w-][\w.-]*/[\w.-]+")
OFFICIAL_FILES = ("pytorch_model.bin", "model.safetensors")  # the order the official loaders try them in
EMBED_TOLERANCE = 1e-2  # relative difference; fp16 / bf16 copies of one embedding stay far below it


def load_drafter(spec: str, method: str, embed_weight: torch.Tensor, target_config) -> Drafter:
    """A drafter for `method`, ready for `Engine.add_drafter`, from a folder, a checkpoint file or a Hub id. EAGLE-1
    loads an EAGLE-2 drafter (drafters.BORROWED)."""
    from . import for_method, weights_kind

    return for_method(_load(spec, weights_kind(method), embed_weight, target_config), method)


def _load(spec: str, method: str, embed_weight: torch.Tensor, target_config) -> Drafter:
    path = locate(spec)
    folder = path.parent if path.is_file() else path
    config = read_json(folder / "config.json") if (folder / "config.json").is_file() else {}
    if "kind" in config:
        drafter = Drafter.from_pretrained(folder)
        if drafter.kind != method:
            raise GumihoError(f"{spec} is a {drafter.kind} drafter; it cannot serve method {method}")
        return drafter
    file = path if path.is_file() else next((folder / n for n in OFFICIAL_FILES if (folder / n).is_file()), None)
    if file is None:
        raise GumihoError(f"{spec} is not a drafter folder: it holds neither our config.json + model.safetensors "
                          f"nor an official {' or '.join(OFFICIAL_FILES)}")
    ckpt = OfficialCheckpoint(read_state_dict(file), str(file), config)
    return official_drafter(ckpt, method, embed_weight, target_config)


def official_drafter(ckpt: OfficialCheckpoint, method: str, embed_weight: torch.Tensor, target_config) -> Drafter:
    if ckpt.kind != method:
        hint = "it has MLP heads (mlp.*)" if ckpt.kind == "gumiho" else "it has no MLP heads (mlp.*)"
        raise GumihoError(f"{ckpt.source} is an official {KIND_NAMES[ckpt.kind]} checkpoint ({hint}); use it with "
                          f"--method {ckpt.kind}, not {method}")
    config = infer_config(ckpt, target_config)
    check_keys(ckpt, config)
    if EMBED in ckpt.state:
        check_embedding(ckpt.state[EMBED], embed_weight, ckpt.source)
    drafter = Drafter.from_config(config)
    drafter.load_state_dict(to_ours(ckpt, config), strict=True)
    return drafter.eval()


def check_embedding(theirs: torch.Tensor, target: torch.Tensor, source: str) -> None:
    """The checkpoint's frozen embedding copy must be the target's (the drafter uses the target's own). Compared
    in row blocks on the target's device, so that a large vocabulary needs no fp32 copy of the whole table."""
    error = norm = 0.0
    for start in range(0, target.shape[0], 8192):
        rows = target[start:start + 8192].detach().float()
        error += float((theirs[start:start + 8192].to(rows.device).float() - rows).pow(2).sum())
        norm += float(rows.pow(2).sum())
    diff = (error / max(norm, 1e-24)) ** 0.5
    if diff > EMBED_TOLERANCE:
        raise GumihoError(f"{source}: {EMBED} differs from the target's embedding (relative difference {diff:.3g}); "
                          "the drafter was trained for another model")


def locate(spec: str) -> Path:
    path = Path(spec).expanduser()
    if path.exists():
        return path
    if not HUB_ID.fullmatch(spec):
        raise GumihoError(f"drafter {spec} does not exist")
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(spec, allow_patterns=["config.json", *OFFICIAL_FILES]))
    except (OSError, ValueError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise GumihoError(f"drafter {spec} is not a local folder and could not be fetched from the Hugging Face "
                          f"Hub ({reason})") from None


def read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise GumihoError(f"{path} is not readable JSON: {exc}") from None
    if not isinstance(data, dict):
        raise GumihoError(f"{path} is not a JSON object")
    return data


def read_state_dict(file: Path) -> dict[str, torch.Tensor]:
    """A flat {name: tensor} dict from a safetensors file or a `torch.save`d state dict."""
    try:
        if file.suffix == ".safetensors":
            state = load_file(str(file))
        else:
            state = torch.load(file, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        raise GumihoError(f"{file} is not a state dict file: torch.load(weights_only=True) refused it (not a "
                          "PyTorch checkpoint, or one holding Python objects besides tensors)") from None
    except (RuntimeError, EOFError, ValueError, OSError, SafetensorError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise GumihoError(f"{file} is not a state dict file ({reason})") from None
    if not isinstance(state, dict):
        raise GumihoError(f"{file} is not a state dict: it holds a {type(state).__name__}")
    bad = next((k for k, v in state.items() if not isinstance(k, str) or not isinstance(v, torch.Tensor)), None)
    if bad is not None:
        raise GumihoError(f"{file} is not a state dict of tensors: entry {bad!r} holds a {type(state[bad]).__name__}")
    return state
