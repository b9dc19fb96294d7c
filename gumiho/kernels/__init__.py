"""Small C++ kernels, compiled on first use with torch's extension builder and cached per machine.

`row_attention()` returns the compiled row-consistent attention (attention.cpp), or None where it cannot be built
(no C++ compiler, or GUMIHO_KERNELS=0): callers then use torch's SDPA, which is as fast but rounds a tree's rows
differently from a one-token step's. The build takes about a minute once; it lands in
~/.cache/gumiho/kernels/<source hash>-<cpu capability>, so a machine with another instruction set, or another
version of the source, builds its own.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import sys
from functools import lru_cache
from pathlib import Path
from types import ModuleType

import torch

log = logging.getLogger(__name__)
SOURCE = Path(__file__).with_name("attention.cpp")


def _flags(capability: str) -> list[str]:
    vector = ["-mavx2", "-mfma"] if capability in ("AVX2", "AVX512") else []
    return ["-O3", *vector]


@lru_cache(maxsize=None)
def row_attention() -> ModuleType | None:
    """The compiled kernel module (its `attention(q, keys, values, visible, n, past, scale)`), or None."""
    if os.environ.get("GUMIHO_KERNELS", "1") == "0":
        return None
    from ..target import cache_root  # not at import time: target.py imports llama.py, which imports this

    capability = torch.backends.cpu.get_cpu_capability()
    digest = hashlib.sha256(SOURCE.read_bytes() + torch.__version__.encode()).hexdigest()[:12]
    folder = cache_root() / "kernels" / f"attention-{digest}-{capability.lower()}"
    try:
        from torch.utils.cpp_extension import load

        folder.mkdir(parents=True, exist_ok=True)
        if shutil.which("ninja") is None:  # pip's ninja sits beside this Python, off PATH unless the venv is active
            os.environ["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
        return load(name=f"gumiho_attention_{digest}", sources=[str(SOURCE)], extra_cflags=_flags(capability),
                    build_directory=str(folder), verbose=False)
    except Exception as error:  # no compiler, no ninja, a failed build: fall back, and say why once
        log.warning("row-consistent attention unavailable (%s): using torch's SDPA, which rounds a tree's rows "
                    "differently from a one-token step's", str(error).splitlines()[0] if str(error) else error)
        return None
