"""`polyhead serve --workers 2`: two uvicorn processes on one port, both serving, and a
SIGTERM to the supervisor lets every in-flight stream finish before it exits 0."""

from __future__ import annotations

import concurrent.futures
import signal
import threading
import time

import httpx
import pytest

from tests.conftest import start_gateway

pytestmark = pytest.mark.integration


def test_two_workers_serve_and_drain_on_sigterm(tiny_model_dir, tmp_path):
    gw = start_gateway(tiny_model_dir, tmp_path / "gw.log", POLYHEAD_WORKERS="2",
                       POLYHEAD_BACKEND="echo", POLYHEAD_ECHO_TOKEN_DELAY_S="0.02",
                       POLYHEAD_SHUTDOWN_GRACE_S="60",
                       POLYHEAD_CACHE_DIR=str(tmp_path / "cache"))
    body = {"model": "tiny", "prompt": "workers", "max_tokens": 2}

    def one(_: int) -> int:
        return httpx.post(f"{gw.url}/v1/completions", json=body, timeout=30).status_code

    pid = gw.process.pid
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        children = f.read().split()
    workers = [c for c in children
               if b"spawn_main" in open(f"/proc/{c}/cmdline", "rb").read()]
    assert len(workers) == 2, children  # uvicorn spawns each worker through spawn_main
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        assert list(pool.map(one, range(64))) == [200] * 64

    results: list[tuple[int, str | None]] = []
    started = threading.Barrier(7)

    def stream(i: int) -> None:
        sbody = {"model": "tiny", "prompt": f"drain {i}", "max_tokens": 100, "stream": True}
        with httpx.stream("POST", f"{gw.url}/v1/completions", json=sbody, timeout=60) as r:
            started.wait()
            chunks = [line for line in r.iter_lines() if line.startswith("data: ")]
            results.append((r.status_code, chunks[-1] if chunks else None))

    threads = [threading.Thread(target=stream, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    started.wait(timeout=30)
    t0 = time.monotonic()
    gw.process.send_signal(signal.SIGTERM)
    for t in threads:
        t.join(timeout=60)
    assert gw.process.wait(timeout=60) == 0
    assert time.monotonic() - t0 > 1.0  # 100 tokens at 20 ms: the streams outlived the signal
    assert results == [(200, "data: [DONE]")] * 6
