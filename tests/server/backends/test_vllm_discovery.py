"""Kubernetes engine discovery: EndpointSliceList parsing on documents shaped like the API's
(discovery.k8s.io/v1, https://kubernetes.io/docs/reference/kubernetes-api/service-resources/
endpoint-slice-v1/), and the backend's replica reconciliation on fake replicas."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from typing import Any

import pytest

from heads.engine.types import GenerationRequest
from kernels.row_params import RowParams
from server.backends.vllm.backend import VllmBackend
from server.backends.vllm.discovery import K8sConfig, slice_urls
from server.backends.vllm.signals import EngineSignals
from server.backends.vllm.types import Chunk, Replica, VllmParams

SVC = "ph-polyhead-engine-main"


def endpoint(ip: str, ready: bool | None, pod: str) -> dict[str, Any]:
    conditions = {} if ready is None else {"ready": ready, "serving": ready,
                                          "terminating": not ready}
    return {"addresses": [ip], "conditions": conditions, "nodeName": "node-1",
            "zone": "europe-west4-a",
            "targetRef": {"kind": "Pod", "namespace": "polyhead", "name": pod,
                          "uid": "0d4b5c1e-6f5a-4c1b-9a43-2f1f3c0e9a10"}}


def endpoint_slice(name: str, address_type: str, endpoints: list[dict[str, Any]],
                   ports: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "kind": "EndpointSlice", "apiVersion": "discovery.k8s.io/v1",
        "metadata": {
            "name": name, "namespace": "polyhead", "generateName": f"{SVC}-",
            "uid": "7c7a1c52-1d2e-4b7a-8c55-95c6a3e0c2f1", "resourceVersion": "48213",
            "generation": 3, "creationTimestamp": "2026-11-30T09:12:44Z",
            "labels": {"kubernetes.io/service-name": SVC,
                       "endpointslice.kubernetes.io/managed-by":
                           "endpointslice-controller.k8s.io"},
            "ownerReferences": [{"apiVersion": "v1", "kind": "Service", "name": SVC,
                                 "uid": "5e1f0a7b-3c2d-4e8f-9a6b-1c2d3e4f5a6b",
                                 "controller": True, "blockOwnerDeletion": True}],
        },
        "addressType": address_type, "endpoints": endpoints, "ports": ports,
    }


def slice_list(*items: dict[str, Any]) -> dict[str, Any]:
    return {"kind": "EndpointSliceList", "apiVersion": "discovery.k8s.io/v1",
            "metadata": {"resourceVersion": "48290"}, "items": list(items)}


PORTS = [{"name": "http", "protocol": "TCP", "port": 8001},
         {"name": "metrics", "protocol": "TCP", "port": 9090}]
DOC = slice_list(
    endpoint_slice(f"{SVC}-x7k2p", "IPv4", [
        endpoint("10.8.0.11", True, "engine-a"),
        endpoint("10.8.0.12", False, "engine-b"),  # terminating
        endpoint("10.8.0.13", None, "engine-c"),  # unknown: the reference says treat as ready
    ], PORTS),
    # During a rollout the same endpoint may sit in two slices.
    endpoint_slice(f"{SVC}-q9d4m", "IPv4", [endpoint("10.8.0.11", True, "engine-a")], PORTS),
    endpoint_slice(f"{SVC}-v6a1b", "IPv6", [endpoint("fd00::1:b", True, "engine-d")], PORTS),
    endpoint_slice(f"{SVC}-empty", "IPv4", [], [{"name": "http", "protocol": "TCP",
                                                 "port": None}]),
)


def test_ready_endpoints_on_the_named_port() -> None:
    assert slice_urls(DOC, "http") == {"http://10.8.0.11:8001", "http://10.8.0.13:8001",
                                       "http://[fd00::1:b]:8001"}


def test_port_by_number_and_missing_port() -> None:
    assert slice_urls(DOC, "9090") == {"http://10.8.0.11:9090", "http://10.8.0.13:9090",
                                       "http://[fd00::1:b]:9090"}
    assert slice_urls(DOC, "grpc") == set()
    # A Service with no endpoints yet: the API sends "endpoints": null.
    empty = endpoint_slice("e", "IPv4", [], PORTS) | {"endpoints": None}
    assert slice_urls(slice_list(empty), "http") == set()
    assert slice_urls({"kind": "EndpointSliceList", "items": None}, "http") == set()


def test_config_needs_a_service() -> None:
    with pytest.raises(ValueError, match="vllm_k8s_service"):
        K8sConfig("https://10.0.0.1:443", "polyhead", "", "http")


class FakeReplica:
    """A replica whose streams yield one token per `gate` release."""

    def __init__(self, name: str) -> None:
        self.name, self.heads, self.offsets = name, frozenset({"h"}), {"h": 0}
        self.up, self.signals = False, EngineSignals()
        self.started = self.stopped = False
        self.gate: asyncio.Queue[None] = asyncio.Queue()

    async def start(self) -> None:
        self.started = self.up = True

    async def stop(self) -> None:
        self.stopped = True

    async def poll(self) -> None:
        pass

    async def stream(self, params: VllmParams, request_id: str) -> AsyncGenerator[Chunk, None]:
        for i in range(params.max_tokens):
            await self.gate.get()
            last = i == params.max_tokens - 1
            yield Chunk((i,), None, "length" if last else None)


class FakeDiscovery:
    def __init__(self) -> None:
        self.urls: set[str] | None = set()
        self.made: dict[str, FakeReplica] = {}

    def make(self, url: str) -> Replica:
        self.made[url] = FakeReplica(url)
        return self.made[url]

    async def discover(self) -> set[str] | None:
        return self.urls

    async def close(self) -> None:
        pass


def _request(n: int) -> GenerationRequest:
    return GenerationRequest("r1", "h", (1, 2), n, RowParams(temperature=0.0), frozenset())


async def _reconcile() -> None:
    found = FakeDiscovery()
    backend = VllmBackend([], {"h": 100}, poll_interval_s=0.05, discovery=found)
    found.urls = {"http://a:1", "http://b:1"}
    await backend.start()
    names = lambda: sorted(r.name for r in backend.replicas)  # noqa: E731
    assert names() == ["http://a:1", "http://b:1"] and found.made["http://b:1"].started

    a = found.made["http://a:1"]
    a.gate.put_nowait(None)
    stream = backend.generate(_request(3))
    first = await anext(stream)  # in flight on a (least loaded, first)
    found.urls = {"http://b:1"}  # a leaves discovery mid-stream
    await asyncio.sleep(0.2)
    assert names() == ["http://b:1"] and not a.stopped  # not routable any more, not cut
    found.urls = {"http://a:1", "http://b:1"}  # back before it drained: the same replica
    await asyncio.sleep(0.2)
    assert a in backend.replicas and not a.stopped
    found.urls = {"http://b:1"}
    a.gate.put_nowait(None)
    a.gate.put_nowait(None)
    rest = [e async for e in stream]
    assert [first.token_id, *(e.token_id for e in rest)] == [0, 1, 2]
    assert rest[-1].finish_reason == "length"
    await asyncio.sleep(0.2)
    assert a.stopped and names() == ["http://b:1"]  # drained: stopped at the next poll

    found.urls = None  # the API could not answer: keep the set as it is
    await asyncio.sleep(0.2)
    assert names() == ["http://b:1"]
    found.urls = {"http://b:1", "http://c:1"}
    await asyncio.sleep(0.2)
    assert names() == ["http://b:1", "http://c:1"]
    await backend.stop()
    assert found.made["http://b:1"].stopped and found.made["http://c:1"].stopped


def test_reconcile_adds_and_drains_replicas() -> None:
    asyncio.run(_reconcile())
