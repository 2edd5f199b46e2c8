"""`polyhead serve --workers 2`: two uvicorn processes on one port, both serving, and a
SIGTERM to the supervisor lets every in-flight stream finish before it exits 0."""

from __future__ import annotations

import concurrent.futures
import signal
import time

import httpx
import pytest

from tests.conftest import start_gateway
from tests.process_util import InFlightStreams

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

    streams = InFlightStreams(gw.url, 6, max_tokens=100)
    streams.start()
    t0 = time.monotonic()
    gw.process.send_signal(signal.SIGTERM)
    results = streams.join()
    assert gw.process.wait(timeout=60) == 0
    assert time.monotonic() - t0 > 1.0  # 100 tokens at 20 ms: the streams outlived the signal
    assert all(code == 200 and last == "data: [DONE]" for code, last, _ in results)
    assert len(results) == 6
