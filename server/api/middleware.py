"""ASGI middleware around every request: correlation id, drain and in-flight limits, and the
latency histogram by route template, method and status."""

from __future__ import annotations

import json
import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from server.api.errors import error_body
from server.errors import APIError, TooManyRequests, Unavailable
from server.ops.readiness import Lifecycle
from server.ops.request_context import start_request

API_PREFIX = "/v1/"


class GatewayMiddleware:
    def __init__(self, app: ASGIApp, lifecycle: Lifecycle, max_inflight: int = 0) -> None:
        self.app = app
        self.lifecycle = lifecycle
        self.max_inflight = max_inflight
        self.inflight = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        headers = dict(scope.get("headers") or [])
        incoming = headers.get(b"x-request-id")
        ctx = start_request(incoming.decode("latin-1") if incoming else None)
        status = 500
        api = scope["path"].startswith(API_PREFIX)

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                raw = [(k, v) for k, v in message.get("headers", []) if k != b"x-request-id"]
                raw.append((b"x-request-id", ctx.request_id.encode()))
                if api:  # engine wait so far: complete for JSON bodies, ~0 for a stream's start
                    raw.append((b"server-timing", f"engine;dur={ctx.engine_s * 1e3:.3f}".encode()))
                message = {**message, "headers": raw}
            await send(message)

        try:
            if api and self.lifecycle.draining:
                await _reject(send_with_id, Unavailable("the gateway is shutting down"))
            elif api and self.max_inflight and self.inflight >= self.max_inflight:
                scope["polyhead.reject_reason"] = "inflight"
                await _reject(send_with_id, TooManyRequests(
                    f"over {self.max_inflight} requests in flight; retry shortly",
                    headers={"retry-after": "1"}, reason="inflight"))
            elif api:
                self.inflight += 1
                try:
                    await self.app(scope, receive, send_with_id)
                finally:
                    self.inflight -= 1
            else:
                await self.app(scope, receive, send_with_id)
        finally:
            elapsed = time.perf_counter() - started
            self._observe(scope, status, elapsed, elapsed - ctx.engine_s if api else None)

    @staticmethod
    def _observe(scope: Scope, status: int, seconds: float, overhead: float | None) -> None:
        metrics = getattr(scope["app"].state, "metrics", None) if "app" in scope else None
        if metrics is None:
            return
        route = getattr(scope.get("route"), "path", None) or "unmatched"
        metrics.http_latency.labels(route, scope["method"], str(status)).observe(seconds)
        if overhead is not None and route != "unmatched":
            metrics.overhead.labels(route).observe(max(0.0, overhead))
        if status == 429:
            reason = scope.get("polyhead.reject_reason", "other")
            metrics.admission_rejections.labels(reason).inc()


async def _reject(send: Send, err: APIError) -> None:
    payload = json.dumps(error_body(err.message, err.type, err.param, err.code)).encode()
    headers = [(b"content-type", b"application/json"),
               (b"content-length", str(len(payload)).encode())]
    headers += [(k.encode(), v.encode()) for k, v in err.headers.items()]
    await send({"type": "http.response.start", "status": err.status, "headers": headers})
    await send({"type": "http.response.body", "body": payload})
