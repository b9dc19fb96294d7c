"""Start `python app.py` on a free port for a test module, and stop it afterwards."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = ROOT / "artifacts"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def served_app(name: str, *flags: str, timeout_s: float = 180) -> Iterator[str]:
    """The URL of a fresh app process started with `flags`; its output goes to artifacts/<name>.log."""
    ARTIFACTS.mkdir(exist_ok=True)
    port = free_port()
    log = open(ARTIFACTS / f"{name}.log", "w")
    process = subprocess.Popen([sys.executable, "app.py", "--port", str(port), *flags], cwd=ROOT, stdout=log,
                               stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/"
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"app.py exited with {process.returncode}; see artifacts/{name}.log")
            try:
                with urllib.request.urlopen(url, timeout=5) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"app.py did not serve {url} within {timeout_s} s")
            time.sleep(0.5)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
        log.close()
