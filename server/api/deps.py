"""Typed FastAPI dependencies; tests override them through app.dependency_overrides.

They are `async def` although none awaits: FastAPI runs a plain `def` dependency in the
threadpool, a thread hand-off per dependency per request (~13% of the gateway's CPU under
load); none of them blocks, so they run on the event loop instead."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from router.router import Router
from server.errors import BadRequest, Forbidden, NotFound, Unauthorized
from server.gateway.gateway import Gateway
from server.ops.audit import AuditLog
from server.ops.auth import KeyRing, bearer
from server.ops.metrics import Metrics
from server.ops.readiness import Lifecycle
from server.settings import Settings


async def get_settings(request: Request) -> Settings:
    return request.app.state.settings


async def get_gateway(request: Request) -> Gateway:
    return request.app.state.gateway


async def get_metrics(request: Request) -> Metrics:
    return request.app.state.metrics


async def get_lifecycle(request: Request) -> Lifecycle:
    return request.app.state.lifecycle


SettingsDep = Annotated[Settings, Depends(get_settings)]
GatewayDep = Annotated[Gateway, Depends(get_gateway)]
MetricsDep = Annotated[Metrics, Depends(get_metrics)]
LifecycleDep = Annotated[Lifecycle, Depends(get_lifecycle)]


async def get_router(gw: GatewayDep) -> Router:
    return gw.router


RouterDep = Annotated[Router, Depends(get_router)]


async def require_admin(request: Request) -> str:
    """Bearer-token guard for /admin; returns the token's name, the audit trail's actor."""
    keys: KeyRing = request.app.state.admin_keys
    if not keys:
        raise Forbidden("the admin API is disabled: set POLYHEAD_ADMIN_TOKEN to enable it")
    token = bearer(request.headers.get("authorization", ""))
    # KeyRing.match compares in constant time (hmac.compare_digest against every key).
    actor = keys.match(token) if token else None
    if actor is None:
        raise Unauthorized("missing or invalid admin token",
                           headers={"WWW-Authenticate": "Bearer"})
    return actor


AdminDep = Annotated[str, Depends(require_admin)]


async def require_client(request: Request, gw: GatewayDep) -> str:
    """The client API key's name (401 when keys are configured and none matches)."""
    return gw.guard.authenticate(request.headers.get("authorization", ""))


ClientDep = Annotated[str, Depends(require_client)]


async def get_audit(request: Request) -> AuditLog:
    return request.app.state.audit


AuditDep = Annotated[AuditLog, Depends(get_audit)]


# The same OpenAI and tokenizer routes are served again under this prefix, pinned to one
# head, for clients that take only a base URL (lm-eval's remote tokenizer, `vllm bench`).
HEAD_PREFIX = "/heads/{head}"


async def get_path_head(request: Request, gw: GatewayDep) -> str | None:
    """The head a `/heads/{head}/...` path pins; None on the plain routes."""
    head = request.path_params.get("head")
    if head is None:
        return None
    if head not in gw.manifest.head_names:
        raise NotFound(f"head '{head}' does not exist; heads: "
                       f"{', '.join(gw.manifest.head_names)}", param="path")
    return head


PathHeadDep = Annotated[str | None, Depends(get_path_head)]


def pin_model(model: str | None, head: str | None, gw: Gateway) -> str | None:
    """The body's `model` under a head path: the model's own name (or none) becomes
    NAME:HEAD; a body that pins another head contradicts its path (400)."""
    if head is None:
        return model
    pinned = f"{gw.manifest.model_name}:{head}"
    if model in (None, gw.manifest.model_name, pinned):
        return pinned
    raise BadRequest(f"model '{model}' contradicts the path's head '{head}'", param="model")
