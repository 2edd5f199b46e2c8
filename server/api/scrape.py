"""GET /metrics in the Prometheus text format."""

from __future__ import annotations

import math

from fastapi import APIRouter, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from router.compression import split_key
from router.step_time_fit import FittedStepTimer
from server.api.deps import GatewayDep, MetricsDep
from server.gateway.gateway import Gateway
from server.gateway.prompt_bpb import refresh as refresh_quality
from server.ops.metrics import Metrics
from server.ops.redis_state import BufferedCounters

router = APIRouter()


@router.get("/metrics")
async def metrics(gw: GatewayDep, m: MetricsDep, request: Request) -> Response:
    # Gauges are read at scrape time rather than pushed from the engine's hot loop.
    gw.refresh_load()
    snap = gw.state.snapshot()
    for head in gw.manifest.head_names:
        m.running.labels(head).set(snap.running[head])
        m.waiting.labels(head).set(snap.waiting[head])
        m.lam.labels(head).set(snap.lam(head))
    m.lam.labels("all").set(snap.lam())
    _routing_gauges(gw, m)
    refresh_quality(m.quality, gw.state, gw.manifest, gw.planner.prompt_bpb,
                    gw.router.active_policy)
    used, total = gw.backend.kv_blocks()
    m.kv_blocks_used.set(used)
    m.kv_blocks_total.set(total)
    kernel_counts = gw.backend.kernel_counts()  # local engine only, so far
    if kernel_counts is not None:
        m.unembed_kernels.set(kernel_counts)
    drafting = gw.backend.drafting_stats()  # local engine only
    if drafting is not None:
        m.drafting.set(*drafting)
    prefix_counts = gw.backend.prefix_cache_counts()  # local engine only
    if prefix_counts is not None:
        m.prefix_cache.set(prefix_counts)
    replica_stats = gw.backend.replica_stats()  # the vLLM backend
    if replica_stats is not None:
        m.engines.set(replica_stats)
    usage: BufferedCounters | None = request.app.state.usage
    m.redis_up.set(1 if usage is None or usage.health.up else 0)
    m.redis_pending.set(usage.pending if usage is not None else 0)
    return Response(generate_latest(m.registry), media_type=CONTENT_TYPE_LATEST)


def _routing_gauges(gw: Gateway, m: Metrics) -> None:
    """Gauges read at scrape time (after gw.refresh_load())."""
    snap = gw.state.snapshot()
    for head in gw.router.heads:
        m.live_batch.labels(head, "raw").set(snap.running[head])
        m.live_batch.labels(head, "smoothed").set(snap.smoothed_running.get(head, 0.0))
    m.live_batch.labels("all", "raw").set(snap.batch)
    m.live_batch.labels("all", "smoothed").set(snap.smoothed_batch)
    forecast = snap.lambda_forecast
    m.lambda_forecast.set(math.nan if forecast is None else forecast)
    m.lambda_effective.set(snap.effective_lam())
    for key, tokens in snap.output_tokens.items():
        head, script = split_key(key)
        if tokens > 0:
            m.output_bpt.labels(head, script).set(snap.output_bytes.get(key, 0) / tokens)
            m.output_tokens.labels(head, script).set(tokens)
    gate = gw.admission
    if gate is not None:
        used = gw.backend.kv_blocks()[0]
        for head in gw.router.heads:
            m.head_max_batch.labels(head).set(gate.admission.max_batch(head, used))
        m.kv_reserved_blocks.set(gate.admission.reserved_blocks)
        m.admission_queue.set(gate.waiting)
    timer = gw.router.timer
    fit = timer.fit if isinstance(timer, FittedStepTimer) else None
    if fit is not None:
        for name in ("overhead_s", "mem_scale", "cmp_scale", "rms_rel_error", "samples"):
            m.calibration.labels(name).set(getattr(fit, name))
