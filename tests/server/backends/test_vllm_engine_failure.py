"""A vLLM engine that dies mid-request is an error to the client, never a normal end: a
stream ends with an error event, a non-streamed call gets a 503 error body."""

from __future__ import annotations

import json
import signal
import threading
import time
from collections.abc import Iterator

import httpx
import psutil
import pytest

from tests.conftest import Gateway, free_port, start_gateway, stop_gateway
from tests.vllm_util import STARTUP_S, Proc, start_vllm_server

pytestmark = [pytest.mark.vllm, pytest.mark.integration, pytest.mark.timeout(900)]


@pytest.fixture
def doomed_engine(vllm_model_dir, tmp_path) -> Iterator[Proc]:
    """A vLLM server of its own: this test kills its engine."""
    server = start_vllm_server(vllm_model_dir, free_port(), tmp_path / "vllm.log")
    yield server
    server.stop()


@pytest.fixture
def vllm_gateway(tiny_model_dir, doomed_engine, tmp_path) -> Iterator[Gateway]:
    gw = start_gateway(tiny_model_dir, tmp_path / "gateway.log", ready_timeout_s=STARTUP_S,
                       POLYHEAD_BACKEND="vllm", POLYHEAD_VLLM_MODE="remote",
                       POLYHEAD_VLLM_URLS=json.dumps([doomed_engine.url]),
                       POLYHEAD_CACHE_DIR=str(tmp_path / "cache"))
    yield gw
    stop_gateway(gw)


def _kill_engine(server: Proc) -> None:
    """SIGKILL the engine core process(es) under the API server, then the server itself."""
    parent = psutil.Process(server.process.pid)
    for child in parent.children(recursive=True):
        child.send_signal(signal.SIGKILL)
    time.sleep(0.5)
    server.process.send_signal(signal.SIGKILL)


def test_engine_killed_mid_request(vllm_gateway, doomed_engine) -> None:
    # Greedy: sampled, the random tiny model can draw EOS within a few hundred tokens and end
    # the stream normally before the kill (greedy runs ~1500 tokens before its EOS).
    long = {"model": "tiny:8k", "prompt": "Once upon a time", "max_tokens": 1900,
            "temperature": 0.0}
    blocking: dict[str, httpx.Response] = {}

    def non_streamed() -> None:
        blocking["r"] = httpx.post(f"{vllm_gateway.url}/v1/completions", json=long, timeout=120)

    with httpx.stream("POST", f"{vllm_gateway.url}/v1/completions", timeout=120,
                      json={**long, "stream": True}) as r:
        assert r.status_code == 200
        lines = (line for line in r.iter_lines() if line)
        for _ in range(3):  # tokens are flowing
            assert next(lines).startswith("data: {")
        worker = threading.Thread(target=non_streamed)
        worker.start()
        time.sleep(1.0)  # the non-streamed request is in the engine too
        _kill_engine(doomed_engine)
        rest = list(lines)
    worker.join(timeout=120)

    events = [json.loads(x[6:]) for x in rest if x.startswith("data: {")]
    errors = [e for e in events if "error" in e]
    assert errors, rest[-5:]
    assert errors[0]["error"]["type"] == "server_error"
    finishes = [c["finish_reason"] for e in events if "choices" in e for c in e["choices"]]
    assert all(f is None for f in finishes), finishes  # no "stop" or "length" after a death
    assert rest[-1] == "data: [DONE]"

    resp = blocking["r"]
    assert resp.status_code == 503, resp.text
    assert resp.json()["error"]["type"] == "server_error"
    # Afterwards: the engine is down, a new request is a 503 at once (not a hang, not a 500).
    after = httpx.post(f"{vllm_gateway.url}/v1/completions", timeout=60,
                       json={"model": "tiny:8k", "prompt": "x", "max_tokens": 2})
    assert after.status_code == 503, after.text
    log = vllm_gateway.log()
    assert "unhandled error" not in log  # mapped as an engine failure, not an unknown one
    assert "request failed: vLLM engine" in log
