"""Time the int4 path's 4-bit products: our kernel (kernels/q4_matmul.cpp, 8-bit activations) against torch's
`_weight_int4pack_mm_for_cpu` (bf16 activations), over the 120 products of one forward of the default model (30
layers' QKV, O, gate-up and down; each matrix its own random Q4_1 blocks, so the weights stream from memory as in a
real decode step). Best of `--repeats`, the two interleaved. Figures in docs/design.md §15.

    PYTHONPATH=. .venv/bin/python scripts/q4_bench.py --rows 1 2 4 8 16
    bash scripts/campaign_hold.sh .venv/bin/python scripts/q4_bench.py     # with the drafter campaign running
"""

from __future__ import annotations

import argparse
import time
from unittest import mock

import torch

from gumiho import int4
from gumiho.int4 import GROUP, Int4Matrix

SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536)]  # SmolLM2-135M: fused QKV, O, fused gate-up, down
LAYERS = 30


def random_q4_1(rows: int, columns: int, generator: torch.Generator) -> tuple[torch.Tensor, ...]:
    q = torch.randint(0, 16, (rows, columns), generator=generator, dtype=torch.uint8)
    d = torch.rand(rows, columns // GROUP, generator=generator) / 50
    return q, d, -8 * d


def best_ms(products: list, inputs: list[torch.Tensor], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for matrix, x in zip(products, inputs):
            matrix(x)
        times.append(time.perf_counter() - start)
    return min(times) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    parser.add_argument("--repeats", type=int, default=11)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if int4.q4_matmul() is None or not int4.torch_int4_available():
        raise SystemExit("error: both kernels are needed (a C++ compiler, and a torch with the CPU int4 kernel)")
    g = torch.Generator().manual_seed(0)
    weights = [random_q4_1(*shape, g) for _ in range(LAYERS) for shape in SHAPES]
    ours = [Int4Matrix(*w) for w in weights]
    with mock.patch.object(int4, "q4_matmul", lambda: None):
        theirs = [Int4Matrix(*w) for w in weights]
    warm = [torch.randn(1, columns, generator=g) for _ in range(LAYERS) for _, columns in SHAPES]
    for products in (theirs, ours):  # first calls pay one-time costs (pages of the new weights, thread start)
        best_ms(products, warm, 3)
    print(f"{args.threads} threads; ms for the {len(weights)} products of one forward, best of {args.repeats}")
    print("| rows | torch's kernel (bf16 activations) | ours (8-bit activations) |\n|---|---|---|")
    for rows in args.rows:
        inputs = [torch.randn(rows, columns, generator=g) for _ in range(LAYERS) for _, columns in SHAPES]
        times: dict[str, list[float]] = {"torch": [], "ours": []}
        for _ in range(2):  # interleaved, so that drift on a shared machine hits both alike
            times["torch"].append(best_ms(theirs, inputs, args.repeats))
            times["ours"].append(best_ms(ours, inputs, args.repeats))
        print(f"| {rows} | {min(times['torch']):.1f} | {min(times['ours']):.1f} |")


if __name__ == "__main__":
    main()
