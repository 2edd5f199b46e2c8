"""Redis connection health and counters that survive a Redis outage.

`BufferedCounters.incr` adds to a local pending table, then flushes it to Redis as one
batch. While Redis is down the batches stay queued and a reconciler task retries every
second, so nothing is lost when Redis comes back. Each batch carries an id, and a Lua script
applies it only if that id is new: a retry after a connection that died between applying a
batch and replying does not count it twice (exactly once, not at least once).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
import uuid

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

log = logging.getLogger(__name__)

RETRY_INTERVAL_S = 1.0
DEDUP_TTL_S = 86400  # how long a batch id is remembered; outages longer than this re-count

# KEYS[1]: the batch id's marker; KEYS[i+1]: the hash of the i-th increment.
# ARGV[1]: marker TTL; ARGV[2i], ARGV[2i+1]: field and amount of the i-th increment.
_APPLY_ONCE = """
if not redis.call('SET', KEYS[1], '1', 'NX', 'EX', ARGV[1]) then return 0 end
for i = 2, #KEYS do
  redis.call('HINCRBY', KEYS[i], ARGV[2 * i - 2], ARGV[2 * i - 1])
end
return 1
"""


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
        # Batches sent (or tried) but not confirmed, oldest first, each under a fixed id.
        self._unconfirmed: list[tuple[str, collections.Counter[tuple[str, str]]]] = []
        self._lock = asyncio.Lock()  # one flush at a time keeps batches in order
        self._next_try = 0.0

    @property
    def pending(self) -> int:
        """Increments not yet confirmed by Redis."""
        return sum(self._pending.values()) + sum(
            sum(b.values()) for _, b in self._unconfirmed)

    def status(self) -> dict:
        """For /readyz and /metrics."""
        h = self.health
        return {"up": h.up, "since": h.since, "pending_increments": self.pending,
                **({} if h.up else {"error": h.last_error})}

    async def incr(self, key: str, amounts: dict[str, int]) -> None:
        """HINCRBY key field amount for each field, in one round trip (or buffered)."""
        for field, amount in amounts.items():
            self._pending[(key, field)] += amount
        await self.flush()

    async def flush(self) -> None:
        async with self._lock:
            if not (self._pending or self._unconfirmed) or (
                    not self.health.up and time.monotonic() < self._next_try):
                return
            if self._pending:
                self._unconfirmed.append((uuid.uuid4().hex, self._pending))
                self._pending = collections.Counter()
            while self._unconfirmed:
                batch_id, batch = self._unconfirmed[0]
                try:
                    await self._apply_once(batch_id, batch)
                except (RedisError, OSError) as e:
                    self._next_try = time.monotonic() + RETRY_INTERVAL_S
                    self.health.mark(False, e)
                    return
                self._unconfirmed.pop(0)
            self.health.mark(True)

    async def _apply_once(self, batch_id: str, batch: collections.Counter[tuple[str, str]]
                          ) -> None:
        items = list(batch.items())
        keys = [f"{self.prefix}batch:{batch_id}"] + [self.prefix + k for (k, _), _ in items]
        args: list[str | int] = [DEDUP_TTL_S]
        for (_, field), amount in items:
            args += [field, amount]
        await self.client.eval(_APPLY_ONCE, len(keys), *keys, *args)

    async def get(self, key: str) -> dict[str, int]:
        raw = await self.client.hgetall(self.prefix + key)
        return {str(k): int(v) for k, v in raw.items()}

    async def reconcile_forever(self) -> None:
        while True:
            await asyncio.sleep(RETRY_INTERVAL_S)
            self._next_try = 0.0
            with contextlib.suppress(Exception):
                await self.flush()
            if not self.pending and not self.health.up:
                await self.ping()

    async def ping(self) -> bool:
        try:
            await self.client.ping()
        except (RedisError, OSError) as e:
            self.health.mark(False, e)
            return False
        self.health.mark(True)
        return True
