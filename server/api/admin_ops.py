"""Admin API, operations: heads (list, drain, undrain), state, policy rollback, audit tail."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

from fastapi import APIRouter, Query, Request

from router.quality import HeadQuality
from router.router import Router
from router.step_time_fit import FittedStepTimer
from server.api.admin_policy import policy_view
from server.api.deps import AdminDep, AuditDep, GatewayDep, MetricsDep, RouterDep, SettingsDep
from server.errors import NotFound
from server.gateway.prompt_bpb import guard_excluded, head_view
from server.ops.drain_sync import DrainSync

log = logging.getLogger(__name__)
router = APIRouter(prefix="/admin")


def _head_state(r: Router, head: str) -> str:
    return "drained" if head in r.drained else "active"


@router.get("/heads")
async def list_heads(_: AdminDep, gw: GatewayDep, settings: SettingsDep) -> dict:
    gw.refresh_load()
    snap = gw.state.snapshot()
    excluded = guard_excluded(gw.router.active_policy)
    gate, used = gw.admission, gw.backend.kv_blocks()[0]

    def max_batch(head: str) -> int | None:
        # KV admission's per-head maximum (what /admin/admission reports); without it, the
        # local engine's cap on its running batch across heads.
        if gate is not None:
            return gate.admission.max_batch(head, used)
        return settings.max_num_seqs if settings.backend == "local" else None

    heads = [
        {"name": h.name, "vocab_size": h.vocab_size, "bytes_per_token": h.bytes_per_token,
         "bpb": h.bpb, "live_batch": snap.running[h.name], "queue": snap.waiting[h.name],
         "max_batch": max_batch(h.name),
         "lambda": snap.lam(h.name), "state": _head_state(gw.router, h.name),
         **head_view(h.name, snap.quality.get(h.name, HeadQuality()), h.bpb, gw.planner.prompt_bpb,
                     excluded)}
        for h in gw.manifest.heads
    ]
    return {"heads": heads}


async def _set_drained(head: str, drained: bool, actor: str, gw: GatewayDep,
                       m: MetricsDep, audit: AuditDep, request: Request) -> dict:
    r = gw.router
    if head not in r.heads:
        raise NotFound(f"head '{head}' does not exist; heads: {', '.join(r.heads)}",
                       param="head")
    before = _head_state(r, head)
    r.set_drained(head, drained)  # in-flight requests keep running on it
    m.head_up.labels(head).set(0 if drained else 1)
    after = _head_state(r, head)
    drains: DrainSync | None = getattr(request.app.state, "drain_sync", None)
    if drains is not None:  # with Redis: every replica follows
        await drains.push()
    if before != after:
        audit.append(actor, "head.drain" if drained else "head.undrain",
                     {"head": head, "state": before}, {"head": head, "state": after})
        log.info("head %s %s by %s", head, after, actor)
    return {"head": head, "state": after}


@router.post("/heads/{head}/drain")
async def drain(head: str, actor: AdminDep, gw: GatewayDep, m: MetricsDep,
                audit: AuditDep, request: Request) -> dict:
    return await _set_drained(head, True, actor, gw, m, audit, request)


@router.post("/heads/{head}/undrain")
async def undrain(head: str, actor: AdminDep, gw: GatewayDep, m: MetricsDep,
                  audit: AuditDep, request: Request) -> dict:
    return await _set_drained(head, False, actor, gw, m, audit, request)


def _calibration_view(r: Router, source: Path | None) -> dict:
    """Which step-time model routes: the analytic roofline, or a fit to measured steps (live
    engine steps, seeded by a `bench engine --calibration-out` file when one is set)."""
    device = r.device
    view: dict = {
        "status": "roofline",
        "device": dataclasses.asdict(device) if dataclasses.is_dataclass(device) else {},
        "file": str(source) if source is not None else None,
    }
    if isinstance(r.timer, FittedStepTimer):
        fit = r.timer.fit
        view["samples"] = r.timer.sample_count
        if fit is not None:
            view["status"] = "fitted"
            view["fit"] = dataclasses.asdict(fit)
    return view


@router.get("/state")
async def state(_: AdminDep, gw: GatewayDep, r: RouterDep, settings: SettingsDep) -> dict:
    gw.refresh_load()
    snap = gw.state.snapshot()
    return {
        "lambda": {"all": snap.lam(), **{h: snap.lam(h) for h in r.heads}},
        "counters": {"served_bytes": dict(snap.served_bytes),
                     "served_tokens": dict(snap.served_tokens),
                     "running": dict(snap.running), "waiting": dict(snap.waiting)},
        "policy": policy_view(r),
        "drained": sorted(r.drained),
        "calibration": _calibration_view(r, settings.calibration_file),

    }


@router.get("/audit")
async def audit_tail(_: AdminDep, audit: AuditDep, n: int = Query(default=50, ge=1, le=1000)):
    return {"records": audit.tail(n)}
