"""Engine discovery through the Kubernetes API: the ready endpoints of a Service's
EndpointSlices (discovery.k8s.io/v1), listed once per health poll.

In a pod, the API server is https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT, with the
service account's token and CA; outside one, `vllm_k8s_api` points at e.g. `kubectl proxy`
(plain HTTP, no token). A failed list keeps the current engines: an API server blip must not
empty the gateway. The backend reconciles its replicas against each answer.
"""

from __future__ import annotations

import logging
import os
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from server.backends.vllm.types import Replica

log = logging.getLogger(__name__)

SA_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
SERVICE_LABEL = "kubernetes.io/service-name"  # set by the EndpointSlice controller


@dataclass(frozen=True, slots=True)
class K8sConfig:
    api: str  # API server base URL
    namespace: str
    service: str
    port: str  # the engines' port: its name in the Service, or a number
    token_file: Path | None = SA_DIR / "token"  # None or missing: no Authorization header
    ca_file: Path | None = SA_DIR / "ca.crt"  # None or missing: the system CAs

    def __post_init__(self) -> None:
        if not self.service:
            raise ValueError("vllm_discovery=kubernetes needs vllm_k8s_service")


def in_cluster_api() -> str:
    host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get(
        "KUBERNETES_SERVICE_PORT", "443")
    if not host:
        raise ValueError("not in a Kubernetes pod (no KUBERNETES_SERVICE_HOST): "
                         "set vllm_k8s_api")
    return f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"


def slice_urls(doc: dict[str, Any], port: str) -> set[str]:
    """Engine base URLs in an EndpointSliceList: ready endpoints, on the named (or numbered)
    port. `conditions.ready` absent means ready (the API reference: unknown is ready)."""
    urls: set[str] = set()
    for item in doc.get("items") or ():
        number = _port(item.get("ports") or (), port)
        kind = item.get("addressType")
        if number is None or kind not in ("IPv4", "IPv6", "FQDN"):
            continue
        for ep in item.get("endpoints") or ():
            if (ep.get("conditions") or {}).get("ready") is False:
                continue  # starting, failing its readiness probe, or terminating
            for addr in ep.get("addresses") or ():
                host = f"[{addr}]" if kind == "IPv6" else addr
                urls.add(f"http://{host}:{number}")
    return urls


def _port(ports: Any, want: str) -> int | None:
    for p in ports:
        number = p.get("port")
        if number is not None and (str(number) == want if want.isdigit()
                                   else p.get("name") == want):
            return int(number)
    return None


class K8sDiscovery:
    def __init__(self, config: K8sConfig, make: Callable[[str], Replica],
                 timeout_s: float = 5.0) -> None:
        self.config = config
        self.make = make  # engine URL -> a replica for it (not started)
        ca = config.ca_file
        verify: ssl.SSLContext | bool = (ssl.create_default_context(cafile=str(ca))
                                         if ca is not None and ca.is_file() else True)
        self._client = httpx.AsyncClient(base_url=config.api, verify=verify, timeout=timeout_s)
        self._path = f"/apis/discovery.k8s.io/v1/namespaces/{config.namespace}/endpointslices"

    def _headers(self) -> dict[str, str]:
        # Read on every call: the kubelet rotates projected service-account tokens.
        tf = self.config.token_file
        if tf is None or not tf.is_file():
            return {}
        return {"Authorization": f"Bearer {tf.read_text().strip()}"}

    async def discover(self) -> set[str] | None:
        """The engines' URLs now, or None when the API could not say (keep the current set)."""
        params = {"labelSelector": f"{SERVICE_LABEL}={self.config.service}"}
        try:
            resp = await self._client.get(self._path, params=params, headers=self._headers())
            resp.raise_for_status()
            return slice_urls(resp.json(), self.config.port)
        # Also a malformed answer: raising here would end the backend's health poller.
        except (httpx.HTTPError, OSError, ValueError, TypeError, KeyError, AttributeError) as e:
            log.warning("listing EndpointSlices of %s/%s failed: %r", self.config.namespace,
                        self.config.service, e)
            return None

    async def close(self) -> None:
        await self._client.aclose()
