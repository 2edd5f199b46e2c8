"""Background loops that keep this replica's routing state in step with the shared store:
λ counters flushed and pulled every few seconds, and the policy followed through Redis."""

from __future__ import annotations

import asyncio
import logging

import redis.asyncio as aioredis

from router.store import PolicySync, StateSync
from server.ops.lambda_store import RedisStore

log = logging.getLogger(__name__)

POLICY_CHECK_S = 1.0  # version check of the shared policy, on top of pub/sub


async def sync_lambda_forever(sync: StateSync, interval_s: float) -> None:
    """Flush and pull λ every `interval_s`, in a worker thread: the file store fsyncs, and
    Redis is a network hop."""
    while True:
        await asyncio.sleep(interval_s)
        try:
            await asyncio.to_thread(sync.flush)
        except Exception as e:  # the increments stay local and go out with the next flush
            log.warning("λ store flush failed: %s", e)


async def follow_policy(ps: PolicySync, store: RedisStore) -> None:
    """Adopt other replicas' policy changes: on each pub/sub message, and every second."""
    while True:
        client = aioredis.Redis.from_url(store.url, socket_connect_timeout=1.0)
        try:
            async with client.pubsub() as pubsub:
                await pubsub.subscribe(store.policy_channel)
                while True:
                    await pubsub.get_message(ignore_subscribe_messages=True,
                                             timeout=POLICY_CHECK_S)
                    await asyncio.to_thread(ps.pull)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # Redis down: retry; the local policy keeps routing meanwhile
            log.warning("policy follow failed: %s", e)
            await asyncio.sleep(POLICY_CHECK_S)
        finally:
            await client.aclose()
