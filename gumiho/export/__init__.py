"""Write one of our drafters in a paper's own checkpoint format (`python -m gumiho export`).

`official`: the format of the drafter's own paper: Gumiho (amd/Gumiho-*) for a Gumiho drafter, EAGLE
(yuhuili/EAGLE-*) for an EAGLE-2 drafter. `eagle`: the EAGLE format, which vLLM's EAGLE loader reads; EAGLE-2
drafters only. Both write `pytorch_model.bin` (official key names, the target's embedding included as
embed_tokens.weight) and a Llama-style `config.json`. The official formats have no draft vocabulary: exporting
drops ours, and the exported drafter proposes from the full vocabulary (as ours does after `use_full_vocab()`).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from ..drafters import Drafter
from ..drafters.official import EMBED, KIND_NAMES, config_json, from_ours
from ..errors import GumihoError

FORMATS = ("official", "eagle")
DTYPES = {"float16": torch.float16, "float32": torch.float32}


def check_format(kind: str, fmt: str) -> None:
    if fmt not in FORMATS:
        raise GumihoError(f"unknown format {fmt!r}; choose one of {', '.join(FORMATS)}")
    if kind not in KIND_NAMES:
        raise GumihoError(f"export writes EAGLE-2 and Gumiho drafters; a {kind} drafter has no official format here")
    if fmt == "eagle" and kind != "eagle2":
        raise GumihoError(f"the eagle format holds EAGLE-2 drafters; this is a {kind} drafter (use --format official)")


def check_out(out: str | Path) -> Path:
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise GumihoError(f"{out} already exists and is not an empty folder")
    return out


def official_state(drafter: Drafter, embed_weight: torch.Tensor, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The drafter's weights under the official names, with the target's embedding, all in `dtype` on the CPU."""
    hidden, vocab = drafter.config.hidden_size, drafter.config.vocab_size
    if tuple(embed_weight.shape) != (vocab, hidden):
        raise GumihoError(f"the drafter (hidden {hidden}, vocabulary {vocab}) does not fit the target "
                          f"(hidden {embed_weight.shape[1]}, vocabulary {embed_weight.shape[0]})")
    state = {EMBED: embed_weight.detach().clone(), **from_ours(drafter)}
    return {k: v.to(device="cpu", dtype=dtype).contiguous() for k, v in state.items()}


def export_drafter(drafter: Drafter, embed_weight: torch.Tensor, max_position_embeddings: int, fmt: str,
                   out: str | Path, dtype: torch.dtype = torch.float16) -> Path:
    """Write `out/pytorch_model.bin` and `out/config.json`; `out` must be new or empty."""
    check_format(drafter.kind, fmt)
    out = check_out(out)
    state = official_state(drafter, embed_weight, dtype)
    out.mkdir(parents=True, exist_ok=True)
    torch.save(state, out / "pytorch_model.bin")
    config = config_json(drafter.config, max_position_embeddings, dtype)
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return out
