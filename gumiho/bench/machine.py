"""Describe the machine a benchmark ran on, and how busy it was meanwhile (shared machines skew timings)."""

from __future__ import annotations

import fcntl
import logging
import os
import platform
import signal
import statistics
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import torch
import transformers

from ..int4 import activations
from ..packed import packs
from ..profile import cpu_features, cpu_name


def _memory_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                return round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return None


def describe(device: torch.device, dtype: torch.dtype, pack: bool = True, forward: str = "lean",
             int4: bool = False, fetch: str = "", attention: str = "", prompts: str = "") -> dict:
    """The machine and the execution path a run used (`pack`, `forward`, `int4`, `fetch`, `attention` (decode steps'
    and trees'), `prompts`: the target's; each choice that changes the run's numbers or its speed named)."""
    cores = os.cpu_count() or 0
    threads = torch.get_num_threads()
    packed = pack and not int4 and device.type == "cpu" and packs(dtype)
    precision = (f"int4 weights ({activations()} products), fp32 activations" if int4
                 else str(dtype).removeprefix("torch."))
    features = cpu_features()
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        description = f"{name} (GPU), {str(dtype).removeprefix('torch.')}"
    else:
        name = cpu_name()
        description = (f"{name} ({', '.join(features) or 'no AVX2'}), {cores} cores, {threads} torch threads, "
                       f"{precision}, {forward} forward")
        if packed:
            description += ", oneDNN-packed matmuls"
        for setting in (fetch, f"steps and trees {attention}" if attention else "", prompts):
            if setting:
                description += f", {setting}"
    return {"description": description, "device": device.type, "device_name": name, "cpu": cpu_name(),
            "cores": cores, "threads": threads, "memory_gib": _memory_gib(),
            "dtype": "int4" if int4 else str(dtype),
            "packed_matmuls": packed, "forward": forward, "fetch": fetch, "attention": attention, "prompts": prompts,
            "cpu_features": features,
            "torch": torch.__version__, "transformers": transformers.__version__,
            "python": platform.python_version(), "platform": platform.platform()}


CAMPAIGN_PID = Path(__file__).resolve().parents[2] / "runs" / "campaign" / "campaign.pid"


@contextmanager
def campaign_paused(pid_file: Path | None = None) -> Iterator[bool]:
    """Stop the background drafter campaign (scripts/cpu_campaign.sh writes its process group to `pid_file`;
    $GUMIHO_CAMPAIGN_PID overrides the default) while the block measures, and let it go on afterwards, whatever
    happens in the block. Holders may overlap (this and scripts/campaign_hold.sh): each holds a shared lock on
    hold.lock beside the pid file, and only the last one out continues the campaign. Yields whether a campaign was
    paused; a block that runs inside the campaign (its own steps build engines too) pauses nothing."""
    path = Path(pid_file or os.environ.get("GUMIHO_CAMPAIGN_PID", CAMPAIGN_PID))
    group, hold = None, None
    try:
        group = int(path.read_text().strip())
        if group == os.getpgrp():
            raise ValueError("the campaign itself")
        hold = open(path.with_name("hold.lock"), "a")
        fcntl.flock(hold, fcntl.LOCK_SH)
        os.killpg(group, signal.SIGSTOP)
        _wait_stopped(group)
        logging.getLogger(__name__).warning("paused the drafter campaign (process group %d) while measuring", group)
    except (OSError, ValueError):  # no campaign, a stale file, or not ours to stop
        group = None
    try:
        yield group is not None
    finally:
        if hold is not None:
            fcntl.flock(hold, fcntl.LOCK_UN)
            try:
                fcntl.flock(hold, fcntl.LOCK_EX | fcntl.LOCK_NB)  # no other holder left
                if group is not None:
                    os.killpg(group, signal.SIGCONT)
            except OSError:  # another holder still measures (it continues the campaign), or the campaign ended
                pass
            hold.close()


def _wait_stopped(group: int, timeout: float = 2.0) -> None:
    """Return once every process of `group` is stopped (or after `timeout` s). SIGSTOP is delivered asynchronously:
    a process running on the other core can go on for a moment, and a measurement begun then timed it too (a test
    once caught the campaign's worker still running, state R, as the profile started). Linux /proc only."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        running = False
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()  # after "pid (name)": state, ppid, pgrp, ...
            except (OSError, IndexError):
                continue  # gone meanwhile, or not readable
            if int(fields[2]) == group and fields[0] not in "TtZX":
                running = True
                break
        if not running:
            return
        time.sleep(0.005)


class LoadMonitor:
    """Samples the 1-minute load average every `every` seconds and this process's CPU time over the run.

    `take()` cuts the record so far into a piece (samples, wall_s, cpu_s) that a journal can store; `summary` merges
    the pieces of earlier processes of a resumed run with this one's."""

    def __init__(self, every: float = 5.0):
        self.every, self.samples, self.pieces = every, [os.getloadavg()[0]], []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._wall, self._cpu = time.perf_counter(), time.process_time()

    def _sample(self) -> None:
        while not self._stop.wait(self.every):
            self.samples.append(os.getloadavg()[0])

    def __enter__(self) -> LoadMonitor:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.samples.append(os.getloadavg()[0])
        self.take()

    def take(self) -> dict:
        """The samples, wall and CPU seconds since the last take (or the start)."""
        samples, self.samples = self.samples, []
        wall, cpu = time.perf_counter(), time.process_time()
        piece = {"load": [round(x, 2) for x in samples], "wall_s": round(wall - self._wall, 3),
                 "cpu_s": round(cpu - self._cpu, 3)}
        self._wall, self._cpu = wall, cpu
        self.pieces.append(piece)
        return piece

    def summary(self, threads: int, earlier: list[dict] = ()) -> dict:
        pieces = [*earlier, *self.pieces]
        samples = [x for p in pieces for x in p["load"]] or [os.getloadavg()[0]]
        wall, cpu = sum(p["wall_s"] for p in pieces), sum(p["cpu_s"] for p in pieces)
        cores = os.cpu_count() or 1
        share = cpu / (wall * threads) if wall > 0 else 0.0
        mean, peak = statistics.mean(samples), max(samples)
        return {
            "loadavg_mean": round(mean, 2), "loadavg_max": round(peak, 2), "cores": cores,
            "own_cpu_share": round(share, 3),
            "description": (f"1-min load average {mean:.1f} mean / {peak:.1f} max on {cores} cores (this run "
                            f"itself adds up to {threads}); the benchmark got {share:.0%} of its {threads} "
                            f"threads' CPU time" + ("" if mean <= cores else ": the machine was oversubscribed, "
                                                                             "absolute timings are skewed")),
        }
