"""A frequency-ranked draft vocabulary (FR-Spec, training-free): how often each id of a drafter's draft vocabulary
occurs in assistant replies, stored beside its weights as `vocab_frequency.safetensors`. At inference the drafter
proposes only from the `FREQUENT_DRAFT_VOCAB` most frequent of its ids (`Drafter.keep_frequent`): its draft head
then reads a quarter of the rows.

Why 4,096 of the shipped 16,384 (Intel Xeon with AMX, 2 cores, int4 path, 12 benchmark prompts, 128 new tokens,
docs/training.md#draft-vocabulary): τ is unchanged down to 2,048 ids (Gumiho 1.67 / 1.67 / 1.68 / 1.67 at
16,384 / 8,192 / 4,096 / 2,048, EAGLE-2 1.65 / 1.65 / 1.66 / 1.65) and falls at 1,024 (Gumiho 1.64): the tokens a
drafter gets right are the common ones. The head's top-2 costs 0.259 / 0.160 / 0.103 / 0.067 ms from cache, and
about 0.4 ms of a cycle before, when the target's forward has evicted it. 4,096 keeps a margin for text unlike
the counted replies (88.6% of their tokens fall in it, 95.5% in 8,192).
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

FILE = "vocab_frequency.safetensors"
FREQUENT_DRAFT_VOCAB = 4096

log = logging.getLogger(__name__)


def read_counts(folder: Path, size: int) -> torch.Tensor | None:
    """The counts of a drafter folder's draft-vocabulary ids, in the draft vocabulary's order ([size] int64), or
    None where there is no file, or (with a warning: the drafter then proposes from its whole draft vocabulary)
    where the file does not hold `size` counts."""
    path = folder / FILE
    if not path.is_file():
        return None
    try:
        counts = load_file(str(path))["counts"]
    except (SafetensorError, OSError, KeyError) as exc:
        log.warning("ignoring %s (%s): the drafter proposes from its whole draft vocabulary", path, exc)
        return None
    if counts.shape != (size,) or counts.is_floating_point() or bool((counts < 0).any()):
        log.warning("ignoring %s (%s counts for %d draft ids): the drafter proposes from its whole draft vocabulary",
                    path, tuple(counts.shape), size)
        return None
    return counts.long()


def write_counts(folder: Path, counts: torch.Tensor) -> Path:
    """Write `counts` (one per draft-vocabulary id, in its order) to the drafter folder."""
    path = folder / FILE
    save_file({"counts": counts.long().contiguous()}, str(path))
    return path


def most_frequent(counts: torch.Tensor, keep: int) -> torch.Tensor:
    """Positions of the `keep` largest counts, most frequent first (ties: the earlier position, a lower id)."""
    return torch.argsort(counts, descending=True, stable=True)[:keep]
