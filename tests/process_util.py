"""Real server processes for tests: a handle, and a wait until their health route answers."""

from __future__ import annotations

import subprocess
import threading
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


class InFlightStreams:
    """`n` streamed completions in threads; `start` returns once each has its status line,
    so all are in flight. `join` gives each (status, last data line, data lines)."""

    def __init__(self, url: str, n: int, max_tokens: int) -> None:
        self.results: list[tuple[int, str | None, int]] = []
        self._started = threading.Barrier(n + 1)
        self._threads = [threading.Thread(target=self._stream, args=(url, i, max_tokens))
                         for i in range(n)]

    def _stream(self, url: str, i: int, max_tokens: int) -> None:
        body = {"model": "tiny", "prompt": f"drain {i}", "max_tokens": max_tokens,
                "stream": True}
        with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=60) as r:
            self._started.wait()
            chunks = [line for line in r.iter_lines() if line.startswith("data: ")]
            self.results.append((r.status_code, chunks[-1] if chunks else None, len(chunks)))

    def start(self) -> None:
        for t in self._threads:
            t.start()
        self._started.wait(timeout=30)

    def join(self) -> list[tuple[int, str | None, int]]:
        for t in self._threads:
            t.join(timeout=60)
        return self.results
