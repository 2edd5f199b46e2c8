"""Routing services around the router, entered from the app's lifespan:

- λ persistence: restore the counters from the store at startup, then flush and pull them
  every `lambda_sync_s` (in a worker thread: the file store fsyncs, Redis is a network hop),
  and once more at shutdown;
- the routing policy, in the same store: restored at startup (the configured policy is only
  the first-boot default), saved after each admin change, and with Redis followed live
  (pub/sub, plus a version check every second in case a message was missed);
- with Redis, the drained heads, followed the same way (server.drain_sync);
- KV admission: the gate in front of the engine, sized from the engine's KV blocks;
- the routing gauges, refreshed at scrape time.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import AsyncIterator

import redis.asyncio as aioredis
from fastapi import FastAPI

from router.admission import Admission, KVBudget, OutputRatio
from router.compression import split_key
from router.step_time_fit import FittedStepTimer
from router.store import PolicySync, StateSync
from server.admission_gate import AdmissionGate
from server.drain_sync import DrainSync
from server.lambda_store import RedisStore, make_store
from server.metrics import Metrics
from server.service import GatewayService
from server.settings import Settings

log = logging.getLogger(__name__)

TICKET_TTL_S = 3600.0  # a reservation nobody released in an hour is a leak: reap it


def build_gate(svc: GatewayService, settings: Settings) -> AdmissionGate | None:
    _, total = svc.backend.kv_blocks()
    if not settings.admission or total <= 0:  # the echo backend has no KV cache
        return None
    # A vLLM engine reports its own block size (128 tokens on CPU); the local engine's is ours.
    block_size = svc.backend.kv_block_size() or settings.block_size
    budget = KVBudget(settings.admission_kv_blocks or total, block_size, settings.max_num_seqs)
    ratio = OutputRatio(settings.admission_quantile, settings.admission_prior_ratio)
    admission = Admission(svc.router.profiles, budget, ratio)
    return AdmissionGate(admission, settings.admission_queue, settings.admission_wait_s)


async def _sync_forever(sync: StateSync, interval_s: float, gate: AdmissionGate | None) -> None:
    while True:
        await asyncio.sleep(interval_s)
        try:
            await asyncio.to_thread(sync.flush)
        except Exception as e:  # the increments stay local and go out with the next flush
            log.warning("λ store flush failed: %s", e)
        if gate is not None:
            gate.admission.reap(TICKET_TTL_S)


POLICY_CHECK_S = 1.0  # version check of the shared policy, on top of pub/sub


async def _follow_policy(ps: PolicySync, store: RedisStore) -> None:
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


@contextlib.asynccontextmanager
async def routing_services(app: FastAPI, settings: Settings) -> AsyncIterator[None]:
    svc: GatewayService = app.state.service
    store = make_store(settings)
    sync = StateSync(svc.state, store)
    app.state.lambda_sync = sync
    try:
        await asyncio.to_thread(sync.restore)
    except Exception as e:
        log.error("λ store unreachable at startup (%s); counting from zero until it is", e)
    policy = PolicySync(svc.router, store, lambda: svc.metrics.set_policy(
        svc.router.policy_doc["name"], svc.router.version, svc.router.changed_by))
    app.state.policy_sync = policy
    try:
        await asyncio.to_thread(policy.restore)
    except Exception as e:
        log.error("policy store unreachable at startup (%s); using the configured policy", e)
    svc.admission = build_gate(svc, settings)
    tasks = [asyncio.create_task(_sync_forever(sync, settings.lambda_sync_s, svc.admission))]
    drains: DrainSync | None = None
    if isinstance(store, RedisStore):
        tasks.append(asyncio.create_task(_follow_policy(policy, store)))
        drains = DrainSync(svc.router, store.url, lambda head, drained:
                           svc.metrics.head_up.labels(head).set(0 if drained else 1))
        try:
            await drains.restore()
        except Exception as e:
            log.error("drained heads unreadable at startup (%s); none drained here", e)
        tasks.append(asyncio.create_task(drains.follow_forever()))
    app.state.drain_sync = drains
    try:
        yield
    finally:
        for task in tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        try:
            await asyncio.to_thread(sync.flush)
        except Exception as e:
            log.error("final λ store flush failed: %s", e)
        if isinstance(store, RedisStore):
            store.close()
        if drains is not None:
            await drains.close()


def refresh_routing_metrics(svc: GatewayService, m: Metrics) -> None:
    """Gauges read at scrape time (after svc.refresh_load())."""
    snap = svc.state.snapshot()
    for head in svc.router.heads:
        m.live_batch.labels(head, "raw").set(snap.running[head])
        m.live_batch.labels(head, "smoothed").set(snap.smoothed_running.get(head, 0.0))
    m.live_batch.labels("all", "raw").set(snap.batch)
    m.live_batch.labels("all", "smoothed").set(snap.smoothed_batch)
    forecast = snap.lambda_forecast
    m.lambda_forecast.set(math.nan if forecast is None else forecast)
    m.lambda_effective.set(snap.effective_lam())
    for key, tokens in snap.output_tokens.items():
        head, script = split_key(key)
        if tokens > 0:
            m.output_bpt.labels(head, script).set(snap.output_bytes.get(key, 0) / tokens)
            m.output_tokens.labels(head, script).set(tokens)
    gate = svc.admission
    if gate is not None:
        used = svc.backend.kv_blocks()[0]
        for head in svc.router.heads:
            m.head_max_batch.labels(head).set(gate.admission.max_batch(head, used))
        m.kv_reserved_blocks.set(gate.admission.reserved_blocks)
        m.admission_queue.set(gate.waiting)
    timer = svc.router.timer
    fit = timer.fit if isinstance(timer, FittedStepTimer) else None
    if fit is not None:
        for name in ("overhead_s", "mem_scale", "cmp_scale", "rms_rel_error", "samples"):
            m.calibration.labels(name).set(getattr(fit, name))
