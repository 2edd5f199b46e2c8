"""Drained heads are shared across replicas through Redis: two real gateways, one Redis."""

from __future__ import annotations

import sys
import time

import httpx
import pytest

from tests.conftest import ADMIN_TOKEN, start_gateway, stop_gateway

pytestmark = pytest.mark.integration

ADMIN = {"authorization": f"Bearer {ADMIN_TOKEN}"}


def _states(url: str) -> dict[str, str]:
    r = httpx.get(f"{url}/admin/heads", headers=ADMIN, timeout=10)
    return {h["name"]: h["state"] for h in r.json()["heads"]}


def _until(url: str, head: str, state: str, deadline_s: float) -> float:
    t0 = time.monotonic()
    while _states(url)[head] != state:
        assert time.monotonic() - t0 < deadline_s, f"{head} not {state} on {url}"
        time.sleep(0.02)
    return time.monotonic() - t0


def _pinned(url: str, head: str) -> httpx.Response:
    return httpx.post(f"{url}/v1/completions", timeout=30,
                      json={"model": f"tiny:{head}", "prompt": "x", "max_tokens": 2})


def _routed_heads(url: str, n: int = 12) -> set[str]:
    heads = set()
    for i in range(n):
        r = httpx.post(f"{url}/v1/completions", timeout=30,
                       json={"model": "tiny", "prompt": "y" * (1 + 40 * i), "max_tokens": 2})
        assert r.status_code == 200, r.text
        heads.add(r.headers["x-polyhead-head"])
    return heads


def test_drain_on_one_replica_reaches_the_other(tiny_model_dir, tmp_path, redis_server):
    env = dict(POLYHEAD_ADMIN_TOKEN=ADMIN_TOKEN, POLYHEAD_REDIS_URL=redis_server.url)
    a = start_gateway(tiny_model_dir, tmp_path / "a.log", POLYHEAD_CACHE_DIR=str(tmp_path / "a"),
                      **env)
    b = start_gateway(tiny_model_dir, tmp_path / "b.log", POLYHEAD_CACHE_DIR=str(tmp_path / "b"),
                      **env)
    c = None
    try:
        assert _pinned(b.url, "8k").status_code == 200
        r = httpx.post(f"{a.url}/admin/heads/8k/drain", headers=ADMIN, timeout=10)
        assert r.status_code == 200 and r.json()["state"] == "drained"
        took = _until(b.url, "8k", "drained", 1.0)
        # b no longer routes to the head a drained, and a pinned request there is a 503.
        assert "8k" not in _routed_heads(b.url)
        r = _pinned(b.url, "8k")
        assert r.status_code == 503 and "drained" in r.json()["error"]["message"]
        assert redis_server.client().smembers("polyhead:drained") == {"8k"}

        # A replica started now comes up with the head drained.
        c = start_gateway(tiny_model_dir, tmp_path / "c.log",
                          POLYHEAD_CACHE_DIR=str(tmp_path / "c"), **env)
        assert _states(c.url)["8k"] == "drained"

        # Undrain on b: a and c follow.
        r = httpx.post(f"{b.url}/admin/heads/8k/undrain", headers=ADMIN, timeout=10)
        assert r.status_code == 200
        _until(a.url, "8k", "active", 1.0)
        _until(c.url, "8k", "active", 1.0)
        assert _pinned(a.url, "8k").status_code == 200
        sys.stdout.write(f"\ndrain on a seen by b after {took * 1000:.0f} ms\n")
        assert took < 1.0
    finally:
        for gw in (a, b, c):
            if gw is not None:
                assert stop_gateway(gw) == 0
