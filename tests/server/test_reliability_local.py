"""The overload, SIGTERM-drain and Redis-restart scenarios on a real engine: the tiny model
on the local engine (KV cache, scheduler, KV admission), not the echo backend.

- overload: 429s come from KV admission (reason kv_budget) and carry Retry-After; every
  admitted request completes;
- SIGTERM: every in-flight stream finishes, the process exits 0;
- Redis restart mid-traffic: the per-key counters (requests, prompt and completion tokens)
  are exact afterwards.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import threading
import time
from collections import Counter

import httpx
import pytest

from tests.conftest import start_gateway, stop_gateway
from tests.server.metrics_util import scrape
from tests.server.redis_util import RedisServer, wait_flushed

pytestmark = [pytest.mark.integration, pytest.mark.slow]

CLIENTS = 40
MAX_TOKENS = 24


async def _one(client: httpx.AsyncClient, url: str, i: int) -> tuple[str, int]:
    body = {"model": "tiny:4k", "prompt": f"overload {i}", "max_tokens": MAX_TOKENS,
            "stream": True, "stream_options": {"include_usage": True}}
    async with client.stream("POST", f"{url}/v1/completions", json=body) as r:
        if r.status_code != 200:
            await r.aread()
            assert r.status_code == 429, r.text
            assert int(r.headers["retry-after"]) >= 1
            return "429", 0
        events = [line async for line in r.aiter_lines() if line.startswith("data: ")]
        if events[-1] != "data: [DONE]":
            return "truncated", 0
        usage = json.loads(events[-2][6:])["usage"]
        return "completed", usage["completion_tokens"]


async def _burst(url: str) -> list[tuple[str, int]]:
    limits = httpx.Limits(max_connections=CLIENTS)
    async with httpx.AsyncClient(timeout=httpx.Timeout(120.0), limits=limits) as client:
        return await asyncio.wait_for(
            asyncio.gather(*(_one(client, url, i) for i in range(CLIENTS))), timeout=240)


def test_overload_429s_come_from_kv_admission(tiny_model_dir, tmp_path, record_property):
    # A KV budget of 12 blocks (16 tokens each) holds ~4 requests of 24 output tokens; 4
    # more may wait half a second; the in-flight cap is off, so only admission says 429.
    gw = start_gateway(tiny_model_dir, tmp_path / "gw.log", POLYHEAD_ADMISSION_KV_BLOCKS="12",
                       POLYHEAD_ADMISSION_QUEUE="4", POLYHEAD_ADMISSION_WAIT_S="0.5",
                       POLYHEAD_CACHE_DIR=str(tmp_path / "cache"))
    try:
        results = asyncio.run(_burst(gw.url))
        totals = Counter(kind for kind, _ in results)
        figures = {"sent": CLIENTS, "admitted": totals["completed"] + totals["truncated"],
                   "429": totals["429"], "completed": totals["completed"]}
        record_property("overload", figures)
        sys.stdout.write(f"\nlocal-engine overload: {figures}\n")
        assert sum(totals.values()) == CLIENTS
        assert totals["truncated"] == 0, totals  # no admitted request is lost
        assert totals["429"] > 0 and totals["completed"] >= 4, totals
        assert all(0 < n <= MAX_TOKENS for kind, n in results if kind == "completed")
        m = scrape(gw.url)
        kv = m.get(("polyhead_admission_rejections_total", (("reason", "kv_budget"),)), 0)
        assert kv == totals["429"], m  # every 429 is KV admission's
        # Idle again: every admitted request's KV reservation was released.
        assert m[("polyhead_kv_reserved_blocks", ())] == 0
    finally:
        assert stop_gateway(gw) == 0


def test_sigterm_finishes_every_local_engine_stream(tiny_model_dir, tmp_path):
    gw = start_gateway(tiny_model_dir, tmp_path / "gw.log", POLYHEAD_SHUTDOWN_DELAY_S="1.0",
                       POLYHEAD_SHUTDOWN_GRACE_S="120",
                       POLYHEAD_CACHE_DIR=str(tmp_path / "cache"))
    results: list[tuple[int, str | None, dict | None]] = []
    started = threading.Barrier(7)

    def stream(i: int) -> None:
        body = {"model": "tiny:8k", "prompt": f"drain {i}", "max_tokens": 400,
                "temperature": 0.0, "stream": True, "stream_options": {"include_usage": True}}
        with httpx.stream("POST", f"{gw.url}/v1/completions", json=body, timeout=180) as r:
            started.wait()
            chunks = [line for line in r.iter_lines() if line.startswith("data: ")]
            usage = json.loads(chunks[-2][6:]).get("usage") if len(chunks) > 1 else None
            results.append((r.status_code, chunks[-1] if chunks else None, usage))

    threads = [threading.Thread(target=stream, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    started.wait(timeout=60)  # all 6 streams have their status line: they are in flight
    gw.process.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    assert httpx.get(f"{gw.url}/readyz", timeout=5).status_code == 503
    still_running = 6 - len(results)  # streams that outlived the signal and the 503
    for t in threads:
        t.join(timeout=180)
    assert gw.process.wait(timeout=180) == 0
    assert len(results) == 6
    sys.stdout.write(f"\nSIGTERM: {still_running} of 6 streams still running at the 503; "
                     f"tokens {[u['completion_tokens'] for _, _, u in results if u]}\n")
    assert still_running > 0
    for code, last, usage in results:
        assert code == 200 and last == "data: [DONE]", (code, last)
        assert usage is not None and usage["completion_tokens"] > 0


def _post(url: str, i: int) -> httpx.Response:
    return httpx.post(f"{url}/v1/completions", timeout=30,
                      headers={"authorization": "Bearer sk-shared"},
                      json={"model": "tiny:1k", "prompt": f"count {i}", "max_tokens": 3})


def test_redis_restart_keeps_counters_exact(tiny_model_dir, tmp_path, record_property):
    redis_server = RedisServer(tmp_path)
    redis_server.start()
    gw = start_gateway(tiny_model_dir, tmp_path / "gw.log", POLYHEAD_REDIS_URL=redis_server.url,
                       POLYHEAD_API_KEYS='{"team": "sk-shared"}',
                       POLYHEAD_CACHE_DIR=str(tmp_path / "cache"))
    served = Counter()
    stop = threading.Event()
    errors: list[str] = []

    def traffic() -> None:
        i = 0
        while not stop.is_set():
            r = _post(gw.url, i)
            i += 1
            if r.status_code == 200:
                u = r.json()["usage"]
                served.update(requests=1, prompt_tokens=u["prompt_tokens"],
                              completion_tokens=u["completion_tokens"])
            else:
                errors.append(r.text)

    t = threading.Thread(target=traffic)
    try:
        t.start()
        time.sleep(1.5)
        redis_server.stop()
        time.sleep(1.5)
        assert httpx.get(f"{gw.url}/readyz", timeout=5).json()["redis"]["up"] is False
        redis_server.start()
        time.sleep(1.5)
        stop.set()
        t.join(timeout=60)
        body = wait_flushed(gw.url, 15)
        assert body["up"] and body["pending_increments"] == 0, body
        counted = {k: int(v) for k, v in
                   redis_server.client().hgetall("polyhead:usage:team").items()}
        record_property("served", dict(served))
        record_property("counted_in_redis", counted)
        assert not errors, errors[:3]
        assert served["requests"] > 5
        assert counted == dict(served), (counted, served)
    finally:
        stop.set()
        assert stop_gateway(gw) == 0
        redis_server.stop()
