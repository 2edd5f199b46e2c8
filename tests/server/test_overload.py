"""Bounded loopback load test: 200 concurrent streaming clients, a fixed number of rounds.

Every request must either finish its stream or get a clear 429/503; none may hang; the
gateway's RSS must stay flat from the first round to the last.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter

import httpx
import pytest

from tests.conftest import start_gateway, stop_gateway

pytestmark = [pytest.mark.integration, pytest.mark.slow]
CLIENTS = 200
ROUNDS = 4
MAX_INFLIGHT = 150  # below CLIENTS, so every round overloads the gateway


def rss_mb(pid: int) -> float:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


async def one(client: httpx.AsyncClient, url: str, i: int) -> str:
    body = {"model": "tiny", "prompt": f"load {i}", "max_tokens": 30, "stream": True}
    async with client.stream("POST", f"{url}/v1/completions", json=body) as r:
        if r.status_code != 200:
            await r.aread()
            assert r.status_code in (429, 503), r.status_code
            assert r.json()["error"]["message"]
            if r.status_code == 429:
                assert r.headers["retry-after"]
            return str(r.status_code)
        last = ""
        async for line in r.aiter_lines():
            if line.startswith("data: "):
                last = line
        return "done" if last == "data: [DONE]" else "truncated"


async def round_(url: str) -> Counter:
    limits = httpx.Limits(max_connections=CLIENTS, max_keepalive_connections=CLIENTS)
    async with httpx.AsyncClient(timeout=httpx.Timeout(30.0), limits=limits) as client:
        outcomes = await asyncio.wait_for(
            asyncio.gather(*(one(client, url, i) for i in range(CLIENTS))), timeout=120)
    return Counter(outcomes)


def test_200_streaming_clients_overload(tiny_model_dir, tmp_path, record_property):
    gw = start_gateway(tiny_model_dir, tmp_path / "gw.log", POLYHEAD_BACKEND="echo",
                       POLYHEAD_ECHO_TOKEN_DELAY_S="0.01",
                       POLYHEAD_MAX_INFLIGHT_REQUESTS=str(MAX_INFLIGHT))
    try:
        rss, totals = [], Counter()
        t0 = time.monotonic()
        for _ in range(ROUNDS):
            totals += asyncio.run(round_(gw.url))
            rss.append(rss_mb(gw.process.pid))
        elapsed = time.monotonic() - t0
        record_property("outcomes", dict(totals))
        record_property("rss_mb", [round(x, 1) for x in rss])
        record_property("seconds", round(elapsed, 1))
        assert sum(totals.values()) == CLIENTS * ROUNDS
        assert set(totals) <= {"done", "429", "503"}, totals  # nothing truncated or hung
        assert totals["done"] >= MAX_INFLIGHT * ROUNDS and totals["429"] > 0, totals
        # Memory: after the warm-up round the RSS stays within 10%.
        assert max(rss[1:]) - rss[0] < max(25.0, 0.1 * rss[0]), rss
        health = httpx.get(f"{gw.url}/readyz", timeout=5)
        assert health.status_code == 200 and elapsed < 300
    finally:
        assert stop_gateway(gw) == 0
