"""A drafter's acceptance statistics: how deep its calibration drafts were accepted, per tree width.

Written once per drafter by `python -m gumiho calibrate` into `acceptance.json` beside its weights, read by the
automatic tree choice (`choice.py`). For greedy calibration runs with the widest tree of each top_k, each cycle
keeps the running maximum score rank of its accepted nodes; the tree of total_tokens = n holds the best n - 1 nodes
of the same pool, so the cycle would have accepted the leading nodes whose rank is below n - 1 (exact for greedy
decoding without FTA, given the same context).
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

ACCEPTANCE_FILE = "acceptance.json"


def file_name(method: str = "") -> str:
    """acceptance.json for the folder's own method, acceptance-METHOD.json for a method borrowing its weights."""
    return f"acceptance-{method}.json" if method else ACCEPTANCE_FILE


def borrowed_methods(folder: str | Path) -> list[str]:
    """Methods with their own statistics in a drafter folder besides the folder's own."""
    return sorted(p.stem.removeprefix("acceptance-") for p in Path(folder).glob("acceptance-*.json"))


@dataclass
class Acceptance:
    """Per top_k, one list per calibration cycle: the running maximum rank of its accepted nodes."""

    prefix_ranks: dict[int, list[list[int]]]

    def __post_init__(self) -> None:
        self._below: dict[int, list[int]] = {}  # top_k -> accepted nodes ranked below m, by m (`tau`; not a field)

    def tau(self, top_k: int, n: int) -> float:
        """Tokens a cycle emits with the tree of n tokens at this top_k: 1 + the mean count of accepted nodes ranked
        below n - 1. The counts per rank are summed once per top_k (the choice asks for hundreds of trees)."""
        ranks = self.prefix_ranks[top_k]
        if not ranks:
            return 1.0
        if top_k not in self._below:
            at = Counter(r for cycle in ranks for r in cycle)
            below = [0]
            for rank in range(max(at, default=0) + 1):
                below.append(below[-1] + at[rank])
            self._below[top_k] = below
        below = self._below[top_k]
        return 1.0 + below[min(max(n - 1, 0), len(below) - 1)] / len(ranks)

    def save(self, folder: str | Path, method: str = "") -> None:
        data = {"version": 1, "prefix_ranks": {str(k): v for k, v in sorted(self.prefix_ranks.items())}}
        (Path(folder) / file_name(method)).write_text(json.dumps(data) + "\n")

    @classmethod
    def load(cls, folder: str | Path, method: str = "") -> Acceptance | None:
        """The statistics stored with a drafter (`method`: those of a method that drafts with its weights, as
        EAGLE-1 with EAGLE-2's), or None when there are none, or when they do not parse (with a warning: the drafter
        then drafts its fixed default tree)."""
        path = Path(folder) / file_name(method)
        try:
            data = json.loads(path.read_text())
            ranks = {int(k): [[int(r) for r in cycle] for cycle in v] for k, v in data["prefix_ranks"].items()}
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            log.warning("ignoring %s (%s): the drafter drafts its default tree", path, type(exc).__name__)
            return None
        return cls(ranks) if ranks else None
