"""The one thread that runs the engine in the app's process: loading, warm-up and every run, one job at a time.

Why one long-lived thread rather than a thread per run: torch's CPU kernels run on OpenMP, and libgomp gives each
thread that starts parallel work a team of worker threads of its own. Once the teams' threads outnumber the cores,
libgomp throttles its spinning, so between two parallel kernels a worker sleeps and must be woken, and a decode
step of many small kernels pays that wake-up each time. Measured on a 2-core AMD EPYC Zen 3 (2 torch threads): the
int4 decode step takes 30 ms in the thread that loaded the model and 38 ms in a second thread (tokens/s 28.8 against
23.1), and a 4-bit matrix product 0.24 against 0.33 s per 3,000. One thread keeps one team, as the CLI does.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
from typing import Callable

log = logging.getLogger(__name__)

Job = Callable[[], None]


class EngineThread:
    """Runs submitted jobs in order on one daemon thread, started on first use in each process (a forked worker,
    as on ZeroGPU, starts its own: threads do not survive a fork)."""

    def __init__(self, name: str = "engine"):
        self.name = name
        self._reset()
        os.register_at_fork(after_in_child=self._reset)

    def _reset(self) -> None:
        self._lock = threading.Lock()
        self._jobs: queue.SimpleQueue[Job] | None = None
        self.ident: int | None = None  # the thread's id once started

    def submit(self, job: Job) -> None:
        """Queue `job` (it should handle its own errors: one that raises is logged and the thread goes on)."""
        with self._lock:
            if self._jobs is None:
                self._jobs = queue.SimpleQueue()
                thread = threading.Thread(target=self._serve, args=(self._jobs,), name=self.name, daemon=True)
                thread.start()
                self.ident = thread.ident
            self._jobs.put(job)

    @staticmethod
    def _serve(jobs: queue.SimpleQueue[Job]) -> None:
        while True:
            job = jobs.get()
            try:
                job()
            except Exception:
                log.exception("a job on the engine thread failed")


ENGINE_THREAD = EngineThread()
