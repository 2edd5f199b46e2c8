"""SIGTERM with streams in flight: /readyz turns 503 at once, new API requests get 503,
every in-flight stream finishes, and the process exits 0."""

from __future__ import annotations

import signal
import threading
import time

import httpx
import pytest

from tests.conftest import start_gateway

pytestmark = pytest.mark.integration


def test_sigterm_drains_streams_and_exits_zero(tiny_model_dir, tmp_path):
    gw = start_gateway(tiny_model_dir, tmp_path / "gw.log", POLYHEAD_SHUTDOWN_DELAY_S="1.5",
                       POLYHEAD_SHUTDOWN_GRACE_S="60", POLYHEAD_BACKEND="echo",
                       POLYHEAD_ECHO_TOKEN_DELAY_S="0.02")
    results: list[tuple[int, str | None, int]] = []
    started = threading.Barrier(9)

    def stream(i: int) -> None:
        body = {"model": "tiny", "prompt": f"drain {i}", "max_tokens": 150, "stream": True}
        with httpx.stream("POST", f"{gw.url}/v1/completions", json=body, timeout=60) as r:
            started.wait()
            chunks = [line for line in r.iter_lines() if line.startswith("data: ")]
            results.append((r.status_code, chunks[-1] if chunks else None, len(chunks)))

    threads = [threading.Thread(target=stream, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    started.wait(timeout=30)  # all 8 streams have their status line: they are in flight
    t0 = time.monotonic()
    gw.process.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    ready = httpx.get(f"{gw.url}/readyz", timeout=5)
    assert ready.status_code == 503 and ready.json()["status"] == "draining"
    refused = httpx.post(f"{gw.url}/v1/completions", timeout=5,
                         json={"model": "tiny", "prompt": "late", "max_tokens": 2})
    assert refused.status_code == 503 and refused.json()["error"]["code"] == "unavailable"
    for t in threads:
        t.join(timeout=60)
    assert gw.process.wait(timeout=60) == 0
    # 150 tokens at 20 ms each: the streams outlived the signal by well over a second.
    assert time.monotonic() - t0 > 1.5
    assert len(results) == 8
    assert all(code == 200 and last == "data: [DONE]" and n >= 150 for code, last, n in results)
