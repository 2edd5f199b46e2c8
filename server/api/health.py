"""Liveness (/healthz: the process answers) and readiness (/readyz: it takes traffic)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from server.api.deps import LifecycleDep

router = APIRouter()


@router.get("/healthz")
async def healthz() -> dict:
    return {"status": "ok"}


@router.get("/readyz")
async def readyz(lifecycle: LifecycleDep, request: Request) -> JSONResponse:
    status = 200 if lifecycle.ready else 503
    body: dict = {"status": lifecycle.phase.value}
    usage = request.app.state.usage
    if usage is not None:  # degraded Redis stays ready: it serves on local state
        body["redis"] = usage.status()
    if lifecycle.ready:  # unavailable stays ready too: every other request is served
        body["structured_output"] = request.app.state.gateway.planner.structured_output_status
    return JSONResponse(body, status_code=status)
