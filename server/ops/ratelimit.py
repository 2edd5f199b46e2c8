"""Per-client rate limits: requests/min and tokens/min in fixed one-minute windows.

`RateLimiter.acquire` returns None when the request fits, else the seconds until the
window resets (the Retry-After). Tokens are charged up front (prompt + max_tokens); when the
request ends, `refund` gives back what it did not use, in the window it was charged to (a
window already over limits nothing any more). The Redis limiter shares windows across
replicas and falls back to a local window while Redis is unreachable.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Protocol

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from server.ops.redis_state import RedisHealth

WINDOW_S = 60


@dataclass(frozen=True, slots=True)
class RateLimits:
    rpm: int  # 0 = unlimited
    tpm: int

    @property
    def active(self) -> bool:
        return self.rpm > 0 or self.tpm > 0

    def over(self, requests: int, tokens: int) -> bool:
        return (self.rpm > 0 and requests > self.rpm) or (self.tpm > 0 and tokens > self.tpm)


class RateLimiter(Protocol):
    async def acquire(self, key: str, tokens: int, now: float | None = None) -> float | None: ...

    async def refund(self, key: str, tokens: int, charged_at: float) -> None: ...


def window_of(now: float) -> int:
    return int(now // WINDOW_S)


def _window(now: float) -> tuple[int, float]:
    """(window number, seconds until it ends, at least 1)."""
    return int(now // WINDOW_S), max(1.0, math.ceil(WINDOW_S - now % WINDOW_S))


class MemoryRateLimiter:
    def __init__(self, limits: RateLimits) -> None:
        self.limits = limits
        self._counts: dict[str, tuple[int, int, int]] = {}  # key -> (window, requests, tokens)

    async def acquire(self, key: str, tokens: int, now: float | None = None) -> float | None:
        return self.acquire_now(key, tokens, time.time() if now is None else now)

    async def refund(self, key: str, tokens: int, charged_at: float) -> None:
        self.refund_now(key, tokens, charged_at)

    def refund_now(self, key: str, tokens: int, charged_at: float) -> None:
        w, reqs, toks = self._counts.get(key, (-1, 0, 0))
        if w == window_of(charged_at) and tokens > 0:
            self._counts[key] = (w, reqs, max(0, toks - tokens))

    def acquire_now(self, key: str, tokens: int, now: float) -> float | None:
        window, retry_after = _window(now)
        w, reqs, toks = self._counts.get(key, (window, 0, 0))
        if w != window:
            reqs, toks = 0, 0
        if self.limits.over(reqs + 1, toks + tokens):
            return retry_after
        self._counts[key] = (window, reqs + 1, toks + tokens)
        return None


class RedisRateLimiter:
    def __init__(self, client: aioredis.Redis, limits: RateLimits, health: RedisHealth,
                 prefix: str = "polyhead:rl:") -> None:
        self.client = client
        self.limits = limits
        self.health = health
        self.prefix = prefix
        self.fallback = MemoryRateLimiter(limits)

    async def acquire(self, key: str, tokens: int, now: float | None = None) -> float | None:
        now = time.time() if now is None else now
        window, retry_after = _window(now)
        name = f"{self.prefix}{key}:{window}"
        try:
            async with self.client.pipeline(transaction=True) as pipe:
                pipe.hincrby(name, "requests", 1)
                pipe.hincrby(name, "tokens", tokens)
                pipe.expire(name, 2 * WINDOW_S)
                reqs, toks, _ = await pipe.execute()
            if self.limits.over(reqs, toks):
                async with self.client.pipeline(transaction=True) as pipe:
                    pipe.hincrby(name, "requests", -1)
                    pipe.hincrby(name, "tokens", -tokens)
                    await pipe.execute()
                return retry_after
        except (RedisError, OSError) as e:
            self.health.mark(False, e)
            return self.fallback.acquire_now(key, tokens, now)
        self.health.mark(True)
        return None

    async def refund(self, key: str, tokens: int, charged_at: float) -> None:
        window = window_of(charged_at)
        if tokens <= 0 or window != window_of(time.time()):
            return  # nothing to give back, or a window that limits nothing any more
        try:
            await self.client.eval(_REFUND, 1, f"{self.prefix}{key}:{window}", tokens)
        except (RedisError, OSError) as e:
            self.health.mark(False, e)
            self.fallback.refund_now(key, tokens, charged_at)
            return
        self.health.mark(True)


# Give tokens back to a window that still exists (never recreate an expired one).
_REFUND = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('HINCRBY', KEYS[1], 'tokens', -tonumber(ARGV[1]))
return 1
"""
