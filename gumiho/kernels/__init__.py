"""Small C++ kernels, compiled on first use with torch's extension builder and cached per machine.

- `row_attention()`: the row-consistent attention (attention.cpp) for decode steps and trees.
- `q8_matmul()`: products with a matrix in 8-bit blocks of 32 (q8_matmul.cpp), the int4 path's lm_head.
- `q4_matmul()`: products of 8-bit activations with 4-bit blocks (q4_matmul.cpp), the int4/int8 path's linears.
- `row_ops()`: a decoder layer's per-row operations (rows.cpp): RMS norm, residual sum and norm, SiLU-gated product.
- `tile_matmul()`: a prompt's bf16 products on AMX tiles (tile_matmul.cpp), where the processor has AMX-BF16.
- `prompt_attention()`: a prompt's causal attention in fp32, blocks of queries against blocks of keys
  (prompt_attention.cpp), where the processor has AVX2; with bf16 products too where it has AVX512-BF16, and those on
  AMX tiles where it has AMX-BF16.
Each includes simd.h (the attentions amx.h too); every header's bytes enter each build's hash.

Each returns the compiled module, or None where it cannot be built (no C++ compiler, or GUMIHO_KERNELS=0): callers
then use torch's own operations (SDPA, an fp16 product), as fast or slower, which round a tree's rows differently
from a one-token step's. A build takes about a minute once; it lands in
~/.cache/gumiho/kernels/<name>-<source hash>-<cpu capability>, so a machine with another instruction set, or
another version of the source, builds its own.

A built kernel is imported straight from its folder. A build runs under an OS file lock, which dies with its process;
torch's own lock file does not, and a process killed mid-build (a stopped server, a timed-out command) would leave
every later one waiting on it forever, so a build clears that file once it holds the OS lock.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import logging
import os
import shutil
import sys
from functools import lru_cache
from pathlib import Path
from types import ModuleType

import torch

log = logging.getLogger(__name__)
HERE = Path(__file__).parent
# Kernels that split their work across torch's threads, and those with 512-bit paths (built where AVX-512 has VNNI).
THREADED = ("q8_matmul", "q4_matmul", "attention", "prompt_attention", "rows", "tile_matmul")
WIDE = ("q4_matmul", "q8_matmul", "attention", "prompt_attention", "tile_matmul")
TILED = ("attention", "prompt_attention", "tile_matmul")  # with AMX tiles where the processor has AMX-BF16


def _cpu_flags() -> set[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def wide_vnni() -> bool:
    """Whether the WIDE kernels build with 512-bit VNNI here: the processor has AVX-512 with VNNI and torch may use
    AVX-512 (ATEN_CPU_CAPABILITY=avx2 builds and runs what an AVX2-only processor does, on any machine)."""
    return "-mavx512f" in _flags(WIDE[0], torch.backends.cpu.get_cpu_capability())


def _flags(name: str, capability: str) -> list[str]:
    """Compiler flags: vector units where torch found them (and VNNI's 8-bit dot products where the processor has
    them), and OpenMP for the matrix products, without which `at::parallel_for` runs on one thread (the 2-core Zen
    4 EPYC: the 8-bit head's one row 1.8 -> 0.9 ms). The attention splits only calls large enough to pay for it
    (attention.cpp's SPLIT_WORK: long caches, where one core cannot draw the keys from memory fast enough).
    The WIDE kernels take 512-bit vectors where AVX-512 runs VNNI: the same exact integer sums and the same float
    operations per output, so their results are those of the 256-bit build, bit for bit. The prompt attention adds
    its bf16 products where the processor has AVX512-BF16 (`causal(..., bf16=True)`; its fp32 ones unchanged), and
    both attentions their products on AMX tiles where it has AMX-BF16 (amx.h; used where Linux grants the tiles)."""
    vector = ["-mavx2", "-mfma", "-mf16c"] if capability in ("AVX2", "AVX512") else []
    flags = _cpu_flags()
    # torch's capability, not the processor's flags alone: ATEN_CPU_CAPABILITY=avx2 then builds what an AVX2-only
    # processor runs (its 256-bit and non-VNNI paths), on any machine.
    if capability == "AVX512" and {"avx512_vnni", "avx512vl"} <= flags:
        vector += ["-mavx512vnni", "-mavx512vl"]
        if name in WIDE and {"avx512f", "avx512bw"} <= flags:
            vector += ["-mavx512f", "-mavx512bw"]
            amx = {"avx512_bf16", "amx_tile", "amx_bf16"} <= flags
            if name == "prompt_attention" and "avx512_bf16" in flags or name in TILED and amx:
                vector.append("-mavx512bf16")  # bf16 products (vdpbf16ps) and conversions
            if name in TILED and amx:
                vector += ["-mamx-tile", "-mamx-bf16"]  # decode and tree rows, a prompt's products, on AMX tiles
    return ["-O3", *vector] + _openmp(name)


def _openmp(name: str) -> list[str]:
    """-fopenmp for a kernel that splits its work, where the compiler takes it (Apple's clang does not: there the
    kernel builds without it and runs on one thread)."""
    return ["-fopenmp"] if name in THREADED and sys.platform != "darwin" else []


def _import_built(module: str, folder: Path) -> ModuleType | None:
    """The already built extension `module` in `folder`, or None where it is not built yet."""
    path = folder / f"{module}.so"
    if not path.is_file():
        return None
    spec = importlib.util.spec_from_file_location(module, path)
    loaded = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loaded)
    return loaded


@lru_cache(maxsize=None)
def source_digest() -> str:
    """A digest of every kernel's source and header: what a machine profile's timings depend on besides the machine
    (profile.signature), so that a changed kernel is timed again. Read once a process: the profile asks at every
    signature."""
    files = sorted(HERE.glob("*.cpp")) + sorted(HERE.glob("*.h"))
    return hashlib.sha256(b"".join(path.read_bytes() for path in files)).hexdigest()[:12]


def kernel_root() -> Path:
    """The folder of every built kernel, inside the user's cache."""
    from ..target import cache_root  # not at import time: target.py imports llama.py, which imports this

    return cache_root() / "kernels"


def build_folder(name: str) -> tuple[Path, str]:
    """Where `<name>.cpp` is built on this machine, and the name of its extension module."""
    source = HERE / f"{name}.cpp"
    shared = b"".join(header.read_bytes() for header in sorted(HERE.glob("*.h")))
    capability = torch.backends.cpu.get_cpu_capability()
    recipe = source.read_bytes() + shared + torch.__version__.encode() + " ".join(_flags(name, capability)).encode()
    digest = hashlib.sha256(recipe).hexdigest()[:12]
    return kernel_root() / f"{name}-{digest}-{capability.lower()}", f"gumiho_{name}_{digest}"


def _build(name: str) -> ModuleType | None:
    """The compiled `<name>.cpp` of this folder, or None (with one warning saying why)."""
    if os.environ.get("GUMIHO_KERNELS", "1") == "0":
        return None
    folder, module = build_folder(name)
    source = HERE / f"{name}.cpp"
    capability = torch.backends.cpu.get_cpu_capability()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with open(folder / "build.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # another process building the same kernel: wait for it
            if (built := _import_built(module, folder)) is not None:
                return built
            from torch.utils.cpp_extension import load

            if shutil.which("ninja") is None:  # pip's ninja sits beside this Python, off PATH unless the venv is on
                os.environ["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
            (folder / "lock").unlink(missing_ok=True)  # torch's: left by a process that died building
            return load(name=module, sources=[str(source)], extra_cflags=_flags(name, capability),
                        extra_ldflags=_openmp(name), build_directory=str(folder),
                        verbose=False)
    except Exception as error:  # no compiler, no ninja, a failed build: fall back, and say why once
        log.warning("the %s kernel is unavailable (%s): using torch's own operations, which round a tree's rows "
                    "differently from a one-token step's", name,
                    str(error).splitlines()[0] if str(error) else error)
        return None


@lru_cache(maxsize=None)
def row_attention() -> ModuleType | None:
    """The compiled attention (its `attention(q, keys, values, visible, n, past, scale)`, and `attend`, the same
    from a layer's fused projection: rotary and cache writes included), or None."""
    return _build("attention")


@lru_cache(maxsize=None)
def q8_matmul() -> ModuleType | None:
    """The compiled 8-bit block product (its `q8_matmul(x, q, d, ahead)`), or None."""
    return _build("q8_matmul")


@lru_cache(maxsize=None)
def q4_matmul() -> ModuleType | None:
    """The compiled 8-bit by 4-bit block product (its `q4_matmul(x, records, ahead)`), or None."""
    return _build("q4_matmul")


@lru_cache(maxsize=None)
def row_ops() -> ModuleType | None:
    """The compiled per-row operations (its `rms_norm`, `add_rms_norm`, `silu_mul`, and `top_logprobs` for draft
    heads), or None."""
    return _build("rows")


@lru_cache(maxsize=None)
def prompt_attention() -> ModuleType | None:
    """The compiled causal attention for prompts (its `causal(q, keys, values, past, scale)`), or None (also where
    the build has no vector code: no AVX2)."""
    built = _build("prompt_attention")
    return built if built is not None and built.available() else None


@lru_cache(maxsize=None)
def tile_matmul() -> ModuleType | None:
    """The compiled bf16 products on AMX tiles (its `pack(weight, gated)` and `matmul(x, packed, bias, gated)`), or
    None where the processor or the OS has no AMX tiles."""
    built = _build("tile_matmul") if {"amx_tile", "amx_bf16", "avx512_bf16"} <= _cpu_flags() else None
    return built if built is not None and built.available() else None
