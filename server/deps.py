"""Typed FastAPI dependencies; tests override them through app.dependency_overrides."""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import Depends, Request

from router.router import Router
from server.errors import Forbidden, Unauthorized
from server.lifecycle import Lifecycle
from server.metrics import Metrics
from server.service import GatewayService
from server.settings import Settings


def get_settings(request: Request) -> Settings:
    return request.app.state.settings


def get_service(request: Request) -> GatewayService:
    return request.app.state.service


def get_metrics(request: Request) -> Metrics:
    return request.app.state.metrics


def get_lifecycle(request: Request) -> Lifecycle:
    return request.app.state.lifecycle


SettingsDep = Annotated[Settings, Depends(get_settings)]
ServiceDep = Annotated[GatewayService, Depends(get_service)]
MetricsDep = Annotated[Metrics, Depends(get_metrics)]
LifecycleDep = Annotated[Lifecycle, Depends(get_lifecycle)]


def get_router(service: ServiceDep) -> Router:
    return service.router


RouterDep = Annotated[Router, Depends(get_router)]


def require_admin(request: Request, settings: SettingsDep) -> str:
    """Bearer-token guard for /admin; returns the actor name recorded in the audit trail."""
    if settings.admin_token is None:
        raise Forbidden("the admin API is disabled: set POLYHEAD_ADMIN_TOKEN to enable it")
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    expected = settings.admin_token.get_secret_value().encode()
    # compare_digest keeps the comparison time independent of where the tokens differ.
    if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), expected):
        raise Unauthorized("missing or invalid admin token",
                           headers={"WWW-Authenticate": "Bearer"})
    return settings.admin_actor


AdminDep = Annotated[str, Depends(require_admin)]
