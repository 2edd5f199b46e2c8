"""SIGTERM with streams in flight: /readyz turns 503 at once, new API requests get 503,
every in-flight stream finishes, and the process exits 0."""

from __future__ import annotations

import signal
import time

import httpx
import pytest

from tests.conftest import start_gateway
from tests.process_util import InFlightStreams

pytestmark = pytest.mark.integration


def test_sigterm_drains_streams_and_exits_zero(tiny_model_dir, tmp_path):
    gw = start_gateway(tiny_model_dir, tmp_path / "gw.log", POLYHEAD_SHUTDOWN_DELAY_S="1.5",
                       POLYHEAD_SHUTDOWN_GRACE_S="60", POLYHEAD_BACKEND="echo",
                       POLYHEAD_ECHO_TOKEN_DELAY_S="0.02")
    streams = InFlightStreams(gw.url, 8, max_tokens=150)
    streams.start()
    t0 = time.monotonic()
    gw.process.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    ready = httpx.get(f"{gw.url}/readyz", timeout=5)
    assert ready.status_code == 503 and ready.json()["status"] == "draining"
    refused = httpx.post(f"{gw.url}/v1/completions", timeout=5,
                         json={"model": "tiny", "prompt": "late", "max_tokens": 2})
    assert refused.status_code == 503 and refused.json()["error"]["code"] == "unavailable"
    results = streams.join()
    assert gw.process.wait(timeout=60) == 0
    # 150 tokens at 20 ms each: the streams outlived the signal by well over a second.
    assert time.monotonic() - t0 > 1.5
    assert len(results) == 8
    assert all(code == 200 and last == "data: [DONE]" and n >= 150 for code, last, n in results)
