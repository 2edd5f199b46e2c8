"""Liveness (/healthz: the process answers) and readiness (/readyz: it takes traffic)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from server.deps import LifecycleDep

router = APIRouter()


@router.get("/healthz")
async def healthz() -> dict:
    return {"status": "ok"}


@router.get("/readyz")
async def readyz(lifecycle: LifecycleDep) -> JSONResponse:
    status = 200 if lifecycle.ready else 503
    return JSONResponse({"status": lifecycle.phase.value}, status_code=status)
