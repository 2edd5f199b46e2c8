"""A real Debian redis-server on a loopback port, with an append-only file so its data
survives a stop and restart in the same directory."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import pytest
import redis

from tests.conftest import free_port


class RedisServer:
    def __init__(self, workdir: Path) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.skip("redis-server not installed (scripts/install-system-deps.sh)")
        self.binary = binary
        self.dir = workdir
        self.port = free_port()
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.dir),
             "--appendonly", "yes", "--appendfsync", "always", "--save", ""],
            stdout=(self.dir / "redis.log").open("a"), stderr=subprocess.STDOUT)
        client = redis.Redis(port=self.port)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                if client.ping():
                    return
            except redis.ConnectionError:
                time.sleep(0.05)
        raise RuntimeError("redis-server did not start")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(timeout=10)
            self.proc = None

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port, decode_responses=True)


def wait_flushed(gateway_url: str, timeout_s: float) -> dict:
    """Until the gateway reports Redis up with no increments left to push; its /readyz
    redis block (the caller asserts on it)."""
    import httpx

    deadline = time.monotonic() + timeout_s
    while True:
        body = httpx.get(f"{gateway_url}/readyz", timeout=5).json()["redis"]
        if (body["up"] and body["pending_increments"] == 0) or time.monotonic() > deadline:
            return body
        time.sleep(0.2)
