"""Build the client gate (keys, limits, rate limiter) and the Redis-backed counters.

Entered from the app's lifespan; with `redis_url` the rate-limit windows and the per-key
usage counters live in Redis, and a reconciler flushes increments buffered during outages.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from fastapi import FastAPI

from server.client_guard import ClientGuard
from server.metrics import Metrics
from server.ratelimit import MemoryRateLimiter, RateLimiter, RateLimits, RedisRateLimiter
from server.redis_state import BufferedCounters, RedisHealth, connect
from server.settings import Settings


@contextlib.asynccontextmanager
async def client_services(app: FastAPI, settings: Settings, metrics: Metrics
                          ) -> AsyncIterator[None]:
    health = RedisHealth()
    app.state.redis_health = health
    client = connect(settings.redis_url) if settings.redis_url else None
    usage = BufferedCounters(client, health) if client is not None else None
    app.state.usage = usage
    limits = RateLimits(settings.rate_limit_rpm, settings.rate_limit_tpm)
    limiter: RateLimiter | None = None
    if limits.active:
        limiter = (RedisRateLimiter(client, limits, health) if client is not None
                   else MemoryRateLimiter(limits))
    app.state.guard = ClientGuard(app.state.client_keys, settings.max_n,
                                  settings.max_prompt_bytes, limiter, usage, metrics)
    reconciler = None
    if usage is not None:
        await usage.ping()
        reconciler = asyncio.create_task(usage.reconcile_forever())
    try:
        yield
    finally:
        if reconciler is not None:
            reconciler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reconciler
        if usage is not None:
            await usage.flush()
        if client is not None:
            await client.aclose()


def redis_status(app: FastAPI) -> dict | None:
    """For /readyz and /metrics: None when no Redis is configured."""
    usage: BufferedCounters | None = getattr(app.state, "usage", None)
    if usage is None:
        return None
    h = usage.health
    return {"up": h.up, "since": h.since, "pending_increments": usage.pending,
            **({} if h.up else {"error": h.last_error})}
