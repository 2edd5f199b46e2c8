"""Redis connection health and counters that survive a Redis outage.

`BufferedCounters.incr` adds to a local pending table, then tries to flush it to Redis
(HINCRBY in one MULTI/EXEC). While Redis is down the increments stay pending and a
reconciler task retries every second, so nothing is lost when Redis comes back. One gap
remains: if the connection dies after EXEC ran but before its reply arrived, that batch is
applied twice. This is the seam for issue 5's λ store: pass its counter writes through here.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

log = logging.getLogger(__name__)

RETRY_INTERVAL_S = 1.0


def connect(url: str) -> aioredis.Redis:
    # Short timeouts and no client-side retries: an outage must cost a request milliseconds.
    return aioredis.from_url(url, socket_timeout=0.5, socket_connect_timeout=0.5,
                             retry=Retry(NoBackoff(), 0), decode_responses=True)


class RedisHealth:
    def __init__(self) -> None:
        self.up = True
        self.since = time.time()
        self.last_error = ""

    def mark(self, up: bool, error: BaseException | None = None) -> None:
        if up != self.up:
            self.up, self.since = up, time.time()
            if up:
                log.warning("redis is back")
            else:
                log.warning("redis unreachable (%s); serving on local state", error)
        if error is not None:
            self.last_error = f"{type(error).__name__}: {error}"


class BufferedCounters:
    def __init__(self, client: aioredis.Redis, health: RedisHealth, prefix: str = "polyhead:"):
        self.client = client
        self.health = health
        self.prefix = prefix
        self._pending: collections.Counter[tuple[str, str]] = collections.Counter()
        self._next_try = 0.0

    @property
    def pending(self) -> int:
        """Increments not yet in Redis."""
        return sum(self._pending.values())

    async def incr(self, key: str, amounts: dict[str, int]) -> None:
        """HINCRBY key field amount for each field, in one round trip (or buffered)."""
        for field, amount in amounts.items():
            self._pending[(key, field)] += amount
        await self.flush()

    async def flush(self) -> None:
        if not self._pending or (not self.health.up and time.monotonic() < self._next_try):
            return
        batch, self._pending = self._pending, collections.Counter()
        try:
            async with self.client.pipeline(transaction=True) as pipe:
                for (key, field), amount in batch.items():
                    pipe.hincrby(self.prefix + key, field, amount)
                await pipe.execute()
        except (RedisError, OSError) as e:
            self._pending.update(batch)  # keep them for the reconciler
            self._next_try = time.monotonic() + RETRY_INTERVAL_S
            self.health.mark(False, e)
            return
        self.health.mark(True)

    async def get(self, key: str) -> dict[str, int]:
        raw = await self.client.hgetall(self.prefix + key)
        return {str(k): int(v) for k, v in raw.items()}

    async def reconcile_forever(self) -> None:
        while True:
            await asyncio.sleep(RETRY_INTERVAL_S)
            self._next_try = 0.0
            with contextlib.suppress(Exception):
                await self.flush()
            if not self._pending and not self.health.up:
                await self.ping()

    async def ping(self) -> bool:
        try:
            await self.client.ping()
        except (RedisError, OSError) as e:
            self.health.mark(False, e)
            return False
        self.health.mark(True)
        return True
