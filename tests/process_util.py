"""Real server processes for tests: a handle, and a wait until their health route answers."""

from __future__ import annotations

import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import httpx


@dataclass
class ServerProcess:
    url: str
    process: subprocess.Popen
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def wait_ready(proc: subprocess.Popen, url: str, log_path: Path, timeout_s: float,
               path: str = "/health", poll_s: float = 0.2) -> None:
    """Until GET url+path answers 200; the log's tail is in the error if it never does."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{url} exited early:\n{log_path.read_text()[-4000:]}")
        try:
            if httpx.get(f"{url}{path}", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(poll_s)
    proc.kill()
    raise RuntimeError(f"{url} not ready in {timeout_s} s:\n{log_path.read_text()[-4000:]}")
