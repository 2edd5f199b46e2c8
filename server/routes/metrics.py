"""GET /metrics in the Prometheus text format."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from server.deps import MetricsDep, ServiceDep
from server.ops_wiring import redis_status
from server.prompt_bpb import refresh as refresh_quality
from server.routing import refresh_routing_metrics

router = APIRouter()


@router.get("/metrics")
async def metrics(svc: ServiceDep, m: MetricsDep, request: Request) -> Response:
    # Gauges are read at scrape time rather than pushed from the engine's hot loop.
    svc.refresh_load()
    snap = svc.state.snapshot()
    for head in svc.manifest.head_names:
        m.running.labels(head).set(snap.running[head])
        m.waiting.labels(head).set(snap.waiting[head])
        m.lam.labels(head).set(snap.lam(head))
    m.lam.labels("all").set(snap.lam())
    refresh_routing_metrics(svc, m)
    refresh_quality(m.quality, svc.state, svc.manifest, svc.prompt_bpb, svc.router.active_policy)
    used, total = svc.backend.kv_blocks()
    m.kv_blocks_used.set(used)
    m.kv_blocks_total.set(total)
    kernel_counts = svc.backend.kernel_counts()  # local engine only, so far
    if kernel_counts is not None:
        m.unembed_kernels.set(kernel_counts)
    prefix_counts = svc.backend.prefix_cache_counts()  # local engine only
    if prefix_counts is not None:
        m.prefix_cache.set(prefix_counts)
    replica_stats = svc.backend.replica_stats()  # the vLLM backend
    if replica_stats is not None:
        m.engines.set(replica_stats)
    redis = redis_status(request.app)
    m.redis_up.set(1 if redis is None or redis["up"] else 0)
    m.redis_pending.set(redis["pending_increments"] if redis else 0)
    return Response(generate_latest(m.registry), media_type=CONTENT_TYPE_LATEST)
