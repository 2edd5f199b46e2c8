"""Kubernetes discovery over HTTP. No cluster exists here: a small local HTTP server stands in
for the API server, serving EndpointSliceList JSON at the real path, filtering on the real
labelSelector and checking the bearer token the way the API server would."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest

from server.backends.vllm.discovery import K8sConfig, K8sDiscovery
from tests.conftest import start_gateway, stop_gateway
from tests.server.backends.test_vllm_discovery import (
    SVC,
    FakeReplica,
    endpoint,
    endpoint_slice,
    slice_list,
)
from tests.server.metrics_util import scrape
from tests.vllm_util import STARTUP_S

NS = "polyhead"
PATH = f"/apis/discovery.k8s.io/v1/namespaces/{NS}/endpointslices"


class FakeApiServer(ThreadingHTTPServer):
    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.slices: list[dict[str, Any]] = []
        self.token: str | None = None  # required bearer token, if any
        self.requests: list[str] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    server: FakeApiServer

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        self.server.requests.append(self.path)
        url = urlsplit(self.path)
        want = f"Bearer {self.server.token}"
        if self.server.token and self.headers.get("Authorization") != want:
            return self._send(401, {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                    "reason": "Unauthorized", "code": 401})
        if url.path != PATH:
            return self._send(404, {"kind": "Status", "status": "Failure", "code": 404})
        selector = parse_qs(url.query).get("labelSelector", [""])[0]
        key, _, value = selector.partition("=")
        items = [s for s in self.server.slices if s["metadata"]["labels"].get(key) == value]
        self._send(200, slice_list(*items))

    def _send(self, code: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    server = FakeApiServer()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


PORTS = [{"name": "http", "protocol": "TCP", "port": 8001}]


def test_lists_ready_endpoints_with_the_service_account_token(api, tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("tok-1\n")
    api.token = "tok-1"
    api.slices = [endpoint_slice(f"{SVC}-a", "IPv4", [endpoint("10.8.0.11", True, "e-a"),
                                                      endpoint("10.8.0.12", False, "e-b")], PORTS),
                  endpoint_slice("other-svc-b", "IPv4", [endpoint("10.9.0.1", True, "x")], PORTS)]
    api.slices[1]["metadata"]["labels"]["kubernetes.io/service-name"] = "other-svc"

    async def run() -> list[set[str] | None]:
        d = K8sDiscovery(K8sConfig(api.url, NS, SVC, "http", token, None), make=FakeReplica)
        try:
            first = await d.discover()
            api.token = "tok-2"  # the kubelet rotates the token; the file follows later
            stale = await d.discover()
            token.write_text("tok-2")
            return [first, stale, await d.discover()]
        finally:
            await d.close()

    first, stale, rotated = asyncio.run(run())
    assert first == rotated == {"http://10.8.0.11:8001"}
    assert stale is None  # 401: unknown, the backend keeps what it has
    assert api.requests[0] == (f"{PATH}?labelSelector=kubernetes.io%2Fservice-name%3D{SVC}")


@pytest.mark.vllm
@pytest.mark.integration
@pytest.mark.timeout(900)
def test_gateway_follows_the_service_endpoints(api, tiny_model_dir, vllm_server, tmp_path) -> None:
    """A real gateway discovers a real vLLM engine, loses it when its endpoint turns not
    ready, and finds it again."""
    host, port = vllm_server.url.removeprefix("http://").split(":")
    ports = [{"name": "http", "protocol": "TCP", "port": int(port)}]

    def publish(ready: bool) -> None:
        api.slices = [endpoint_slice(f"{SVC}-a", "IPv4", [endpoint(host, ready, "e-a")], ports)]

    publish(True)
    gw = start_gateway(tiny_model_dir, tmp_path / "gw.log", ready_timeout_s=STARTUP_S,
                       POLYHEAD_BACKEND="vllm", POLYHEAD_VLLM_MODE="remote",
                       POLYHEAD_CACHE_DIR=str(tmp_path / "cache"),
                       POLYHEAD_VLLM_DISCOVERY="kubernetes", POLYHEAD_VLLM_K8S_API=api.url,
                       POLYHEAD_VLLM_K8S_NAMESPACE=NS, POLYHEAD_VLLM_K8S_SERVICE=SVC,
                       POLYHEAD_VLLM_POLL_INTERVAL_S="0.5")
    up = ("polyhead_engine_up", (("engine", vllm_server.url),))
    body = {"model": "tiny:4k", "prompt": "Once upon", "max_tokens": 4, "temperature": 0}
    try:
        assert scrape(gw.url).get(up) == 1
        assert httpx.post(f"{gw.url}/v1/completions", json=body, timeout=60).status_code == 200
        publish(False)
        _wait(lambda: up not in scrape(gw.url))
        r = httpx.post(f"{gw.url}/v1/completions", json=body, timeout=60)
        assert r.status_code == 503 and "no healthy vLLM engine" in r.text
        publish(True)
        _wait(lambda: scrape(gw.url).get(up) == 1)
        assert httpx.post(f"{gw.url}/v1/completions", json=body, timeout=60).status_code == 200
    finally:
        stop_gateway(gw)


def _wait(cond, timeout_s: float = 20) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.2)
