"""GET /metrics in the Prometheus text format."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from server.deps import MetricsDep, ServiceDep

router = APIRouter()


@router.get("/metrics")
async def metrics(svc: ServiceDep, m: MetricsDep) -> Response:
    # Gauges are read at scrape time rather than pushed from the engine's hot loop.
    svc.refresh_load()
    snap = svc.state.snapshot()
    for head in svc.manifest.head_names:
        m.running.labels(head).set(snap.running[head])
        m.waiting.labels(head).set(snap.waiting[head])
        m.lam.labels(head).set(snap.lam(head))
    m.lam.labels("all").set(snap.lam())
    used, total = svc.backend.kv_blocks()
    m.kv_blocks_used.set(used)
    m.kv_blocks_total.set(total)
    return Response(generate_latest(m.registry), media_type=CONTENT_TYPE_LATEST)
