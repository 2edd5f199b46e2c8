"""Drained heads shared across replicas through Redis, as the routing policy is.

The set of drained heads lives in one Redis set. A replica's admin drain/undrain applies
locally first (routing changes at once), then writes the set and publishes on a channel;
every replica follows the channel, and re-reads the set every second in case a message was
missed. While Redis is unreachable, changes stay local and the last one is written when it
answers again (the replica that changed something last wins, as an operator expects).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from router.router import Router

log = logging.getLogger(__name__)

DRAINED_KEY = "polyhead:drained"
DRAINED_CHANNEL = "polyhead:drained:changed"
CHECK_S = 1.0  # the read-back interval, on top of pub/sub


class DrainSync:
    def __init__(self, router: Router, url: str,
                 on_change: Callable[[str, bool], None] | None = None) -> None:
        self.router = router
        self.url = url
        self.on_change = on_change  # (head, drained) after a change adopted from Redis
        self.client = aioredis.Redis.from_url(url, socket_timeout=1.0,
                                              socket_connect_timeout=1.0, decode_responses=True)
        self._unsaved = False  # a local change Redis has not stored yet

    async def restore(self) -> None:
        """At startup: the drained set in Redis replaces the local (empty) one."""
        await self._adopt(await self.client.smembers(DRAINED_KEY))

    async def push(self) -> None:
        """After a local drain/undrain: store this replica's set and tell the others."""
        self._unsaved = True
        try:
            await self._write()
        except (RedisError, OSError) as e:
            log.error("drained heads not shared (Redis: %s); retrying every %.0f s",
                      e, CHECK_S)

    async def _write(self) -> None:
        drained = sorted(self.router.drained)
        async with self.client.pipeline(transaction=True) as pipe:
            pipe.delete(DRAINED_KEY)
            if drained:
                pipe.sadd(DRAINED_KEY, *drained)
            pipe.publish(DRAINED_CHANNEL, ",".join(drained))
            await pipe.execute()
        self._unsaved = False

    async def pull(self) -> None:
        if self._unsaved:  # Redis was down when we changed: ours is the newest change
            await self._write()
            return
        await self._adopt(await self.client.smembers(DRAINED_KEY))

    async def _adopt(self, members: Iterable[bytes | str]) -> None:
        stored = {m.decode() if isinstance(m, bytes) else m for m in members}
        for head in self.router.heads:
            drained = head in stored
            if drained != (head in self.router.drained):
                self.router.set_drained(head, drained)
                log.info("head %s %s (from another replica)", head,
                         "drained" if drained else "active")
                if self.on_change is not None:
                    self.on_change(head, drained)

    async def follow_forever(self) -> None:
        """Adopt other replicas' changes: on each pub/sub message, and every second."""
        while True:
            try:
                async with self.client.pubsub() as pubsub:
                    await pubsub.subscribe(DRAINED_CHANNEL)
                    while True:
                        await pubsub.get_message(ignore_subscribe_messages=True,
                                                 timeout=CHECK_S)
                        await self.pull()
            except asyncio.CancelledError:
                raise
            except Exception as e:  # Redis down: local drain state keeps routing meanwhile
                log.warning("drain follow failed: %s", e)
                await asyncio.sleep(CHECK_S)

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self.client.aclose()
