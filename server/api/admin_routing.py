"""Admin API for routing: decision records, the forecast λ, admission state (admin token)."""

from __future__ import annotations

import asyncio
import logging
import math

from fastapi import APIRouter, Query, Request

from router.planner.live import DEFAULT_MFU, live_plan_json
from router.store import StateSync
from server.api.deps import AdminDep, GatewayDep
from server.errors import BadRequest
from server.schemas import RequestBody

log = logging.getLogger(__name__)
router = APIRouter(prefix="/admin")


class LambdaForecast(RequestBody):
    # Served bytes ÷ training bytes the operator expects; null clears it (measured λ again).
    forecast: float | None


@router.get("/decisions")
async def decisions(_: AdminDep, gw: GatewayDep,
                    limit: int = Query(default=50, ge=1, le=10_000)) -> dict:
    log_ = gw.router.decisions
    return {"capacity": log_.capacity, "total": log_.total,
            "decisions": [d.to_record() for d in log_.last(limit)],
            "drafting": drafting_view(gw)}


def drafting_view(gw: GatewayDep) -> dict | None:
    """Exact drafting as the engine runs it: the k its last drafting step chose, and per
    drafter its acceptance, tokens per verify and break-even batch so far; None on an engine
    without it."""
    stats = gw.backend.drafting_stats()
    if stats is None:
        return None
    _, tallies, k = stats
    return {"k": k, "drafters": {
        h: {"drafts": t.drafted, "acceptance": round(t.accepted / t.drafted, 4)
            if t.drafted else None, "verifies": t.verifies,
            "tokens_per_verify": round(t.committed / t.verifies, 3) if t.verifies else None,
            "verify_seconds": round(t.verify_seconds, 3),
            "break_even_batch": t.break_even_batch} for h, t in sorted(tallies.items())}}


def lambda_view(gw: GatewayDep) -> dict:
    snap = gw.state.snapshot()
    return {"measured": snap.lam(), "forecast": snap.lambda_forecast,
            "effective": snap.effective_lam(),
            "heads": {h: {"lambda": snap.lam(h), "served_bytes": snap.served_bytes[h],
                          "served_tokens": snap.served_tokens[h],
                          "training_bytes": snap.training_bytes[h]}
                      for h in gw.router.heads}}


@router.get("/plan")
async def live_plan(_: AdminDep, gw: GatewayDep,
                    mfu: float = Query(default=DEFAULT_MFU, gt=0, le=1)) -> dict:
    """The lifecycle-optimal V at the live B distribution and λ, and each head's break-even λ
    (router.planner.live): a planning view; routing itself treats existing heads as sunk."""
    r = gw.router
    snap = gw.state.snapshot()
    recent = [(f, int(d.inputs.get("batch", 1))) for f, d in r.recent()]
    training = max(snap.training_bytes.values(), default=0.0) or None
    return live_plan_json(r.profiles, r.timer, recent, snap.effective_lam(), training, mfu,
                          r.policy_doc["name"], r.quality_bound)


@router.get("/lambda")
async def get_lambda(_: AdminDep, gw: GatewayDep) -> dict:
    return lambda_view(gw)


@router.put("/lambda")
async def put_lambda(body: LambdaForecast, actor: AdminDep, gw: GatewayDep,
                     request: Request) -> dict:
    lam = body.forecast
    if lam is not None and (not math.isfinite(lam) or lam < 0):
        raise BadRequest("forecast must be a finite number >= 0, or null", param="forecast")
    sync: StateSync | None = getattr(request.app.state, "lambda_sync", None)
    if sync is None:
        gw.state.set_lambda_forecast(lam)
    else:  # persisted, so replicas and restarts see it
        await asyncio.to_thread(sync.set_forecast, lam)
    log.info("λ forecast set to %s by %s", lam, actor)
    return lambda_view(gw)


@router.get("/admission")
async def admission(_: AdminDep, gw: GatewayDep) -> dict:
    gate = gw.admission
    if gate is None:
        return {"enabled": False}
    a = gate.admission
    used = gw.backend.kv_blocks()[0]
    return {"enabled": True, "total_blocks": a.budget.total_blocks,
            "block_size": a.budget.block_size, "reserved_blocks": a.reserved_blocks,
            "engine_used_blocks": used, "queue": gate.waiting,
            "output_bytes_per_max_token": a.ratio.bytes_per_max_token(),
            "drain_blocks_per_s": a.drain_rate(),
            "heads": {h: {"admitted": a.admitted(h), "max_batch": a.max_batch(h, used),
                          "typical_blocks": a.typical_blocks(h)} for h in gw.router.heads}}
