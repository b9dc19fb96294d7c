"""The 4-bit blocks of a GGUF file's linear layers, as stored, for the int4 path (`int4.py`).

transformers dequantizes a GGUF file to floats on load; the int4 path wants the Q4_1 blocks themselves. llama.cpp's
converter permutes the rows of the query and key projections (its rotary layout); quantized blocks run along a
row, so the rows are permuted back, block bytes and all, exactly as transformers permutes the dequantized rows.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

# GGUF tensor name within a block -> the transformers Llama module it belongs to.
PROJECTIONS = {
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}


def _unpermute_rows(rows: np.ndarray, heads: int) -> np.ndarray:
    """Undo llama.cpp's rotary permutation of a query or key projection's rows (any per-row payload)."""
    half = rows.shape[0] // heads // 2
    return rows.reshape(heads, half, 2, *rows.shape[1:]).swapaxes(1, 2).reshape(rows.shape)


def q4_1_blocks(path: str | Path, heads: int, kv_heads: int) -> dict[str, np.ndarray]:
    """'model.layers.{i}.{module}' -> uint8 [out, in / 32 * 20] for every Q4_1 linear in the file; other tensors
    (norms, the Q8_0 embedding) are left out."""
    from gguf import GGMLQuantizationType, GGUFReader

    blocks: dict[str, np.ndarray] = {}
    for tensor in GGUFReader(str(path)).tensors:
        parts = tensor.name.split(".")  # blk.{i}.{name}.weight
        if tensor.tensor_type != GGMLQuantizationType.Q4_1 or parts[0] != "blk" or parts[2] not in PROJECTIONS:
            continue
        rows = np.asarray(tensor.data)
        if parts[2] == "attn_q":
            rows = _unpermute_rows(rows, heads)
        elif parts[2] == "attn_k":
            rows = _unpermute_rows(rows, kv_heads)
        blocks[f"model.layers.{parts[1]}.{PROJECTIONS[parts[2]]}"] = rows
    return blocks
