"""The journal of a benchmark run in progress, so that a run of many hours survives a crash, a reboot or Ctrl-C.

`<name>.partial.jsonl` in the results folder, one JSON object per line:
  {"identity": {...}, "setup": {"command", "cost_curve", "trees",      first line: what the run measures and the
                                 "auto_tree"}}                         trees it chose, reused when it resumes
  {"segment": k, "started": iso time}                                  one per process that worked on the run
  {"job": [dataset, question_id, temperature, seed], "segment": k,     one per finished conversation: its rows,
   "t": s, "rows": [...], "load": [...], "wall_s": s, "cpu_s": s}      the seconds since its segment started, and
                                                                       the load samples and CPU time meanwhile
`python -m gumiho bench --resume` with the same settings skips the journaled conversations, except, on a CPU, those
whose share of their threads' CPU time fell below 90% of the run's median (another program took the CPU meanwhile):
those are measured again. The journal is deleted once the results are written. Without --resume an unfinished
journal is an error, never silently overwritten.
"""

from __future__ import annotations

import hashlib
import json
import os
import statistics
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import torch

from ..errors import GumihoError

JobKey = tuple[str, object, float, int]
MIN_CPU_SHARE = 0.9  # of the run's median CPU share: a CPU conversation that got less was disturbed


def weights_digest(module: torch.nn.Module) -> str:
    """sha256 over a module's state_dict (names, shapes, bytes): tells whether a drafter changed between runs."""
    digest = hashlib.sha256()
    for name, tensor in module.state_dict().items():
        digest.update(f"{name}:{tuple(tensor.shape)}:{tensor.dtype}".encode())
        digest.update(tensor.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()[:16]


@dataclass
class Journal:
    path: Path
    identity: dict
    setup: dict | None = None
    done: dict[JobKey, list[dict]] = field(default_factory=dict)
    records: list[dict] = field(default_factory=list)
    redo: int = 0  # journaled conversations to measure again
    intact: int | None = None  # with a torn last line: the bytes before it
    segment: int = 0
    _started: float = field(default_factory=time.perf_counter)

    @classmethod
    def open(cls, path: Path, identity: dict, resume: bool, cpu_threads: int | None = None) -> Journal:
        """Start a journal at `path`, or with `resume` continue the one there (it must have the same identity).
        With `cpu_threads` (a CPU run), a conversation whose share of those threads' time is below MIN_CPU_SHARE
        of the median share is not taken as done."""
        identity = json.loads(json.dumps(identity))  # compare in the form it is stored in
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            return cls(path, identity)
        lines, intact = _lines(path)
        records = [line for line in lines if "job" in line]
        if not resume:
            raise GumihoError(f"{path} holds an unfinished run ({len(records)} conversations done): add --resume "
                              "to continue it, or delete the file to start over")
        if lines[0]["identity"] != identity:
            changed = sorted(k for k in identity.keys() | lines[0]["identity"].keys()
                             if identity.get(k) != lines[0]["identity"].get(k))
            raise GumihoError(f"cannot resume {path}: it was started with other {', '.join(changed)}; use the same "
                              "command and drafters, or delete the file to start over")
        journal = cls(path, identity, setup=lines[0]["setup"], records=records, intact=intact,
                      segment=1 + max((line["segment"] for line in lines if "started" in line), default=-1))
        shares = [r["cpu_s"] / (r["wall_s"] * (cpu_threads or 1)) if r["wall_s"] > 0 else 1.0 for r in records]
        floor = MIN_CPU_SHARE * statistics.median(shares) if cpu_threads and shares else 0.0
        for r, share in zip(records, shares):  # a later, undisturbed measurement replaces an earlier one
            if share >= floor:
                journal.done[tuple(r["job"])] = r["rows"]
        journal.redo = len({tuple(r["job"]) for r in records} - journal.done.keys())
        return journal

    @classmethod
    def read(cls, path: Path) -> Journal:
        """The journal at `path` as `--resume` would see it, whatever its identity: a look at a run in progress."""
        identity = _lines(path)[0][0]["identity"]
        machine = identity.get("machine", {})
        return cls.open(path, identity, resume=True,
                        cpu_threads=machine.get("threads") if machine.get("device") == "cpu" else None)

    def begin(self, setup: dict | None = None) -> None:
        """Write the header with `setup` (a new run) and this process's segment line. A torn last line (the
        previous process died while writing it) is cut off first: its conversation is measured again."""
        if self.intact is not None:
            with self.path.open("r+b") as f:
                f.truncate(self.intact)
        if self.setup is None:
            self.setup = json.loads(json.dumps(setup))
            self._append({"identity": self.identity, "setup": self.setup})
        self._started = time.perf_counter()
        self._append({"segment": self.segment, "started": datetime.now(timezone.utc).isoformat(timespec="seconds")})

    def record(self, key: JobKey, rows: list[dict], load: dict) -> None:
        """Journal one finished conversation; `load` holds its load samples, wall_s and cpu_s."""
        record = {"job": list(key), "segment": self.segment, "t": round(time.perf_counter() - self._started, 2),
                  "rows": rows, **load}
        self._append(record)
        self.records.append(record)
        self.done[key] = rows

    def measured_s(self) -> float:
        """The earlier segments' time, each up to its last finished conversation."""
        last: dict[int, float] = {}
        for r in self.records:
            if r["segment"] != self.segment:
                last[r["segment"]] = max(last.get(r["segment"], 0.0), r["t"])
        return sum(last.values())

    def duration_s(self) -> float:
        """The earlier segments' time plus this one's so far."""
        return self.measured_s() + time.perf_counter() - self._started

    def earlier_load(self) -> list[dict]:
        """The load pieces (samples, wall_s, cpu_s) journaled by earlier processes of this run."""
        return [{k: r[k] for k in ("load", "wall_s", "cpu_s")} for r in self.records if r["segment"] != self.segment]

    def segments(self) -> int:
        return self.segment + 1

    def finish(self) -> None:
        self.path.unlink(missing_ok=True)

    def _append(self, line: dict) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps(line) + "\n")
            f.flush()
            os.fsync(f.fileno())  # an hour of measurements should survive a power cut


def _lines(path: Path) -> tuple[list[dict], int | None]:
    """The journal's lines, and when its last line is torn (cut off mid-write), the bytes before that line."""
    raw = Path(path).read_bytes().splitlines(keepends=True)
    lines, size = [], 0
    for number, line in enumerate(raw, 1):
        try:
            complete = line.endswith(b"\n")
            if line.strip():
                lines.append(json.loads(line))
        except (json.JSONDecodeError, UnicodeDecodeError):
            complete = False
        if not complete:
            if number < len(raw):
                raise GumihoError(f"{path}, line {number}, is damaged: delete that line (its conversation is "
                                  "measured again) or the file to start over")
            return _checked(path, lines), size
        size += len(line)
    return _checked(path, lines), None


def _checked(path: Path, lines: list[dict]) -> list[dict]:
    if not lines or not isinstance(lines[0], dict) or "identity" not in lines[0]:
        raise GumihoError(f"{path} is not a benchmark journal; delete it or choose another --name")
    return lines

