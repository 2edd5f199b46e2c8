"""Redis-backed state with a real redis-server: per-key rate limits shared by two gateway
processes, and no lost counts when Redis stops and restarts mid-traffic."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from tests.conftest import start_gateway, stop_gateway
from tests.server.redis_util import wait_flushed

pytestmark = pytest.mark.integration
KEY = {"authorization": "Bearer sk-shared"}


def _post(url: str) -> httpx.Response:
    return httpx.post(f"{url}/v1/completions", headers=KEY, timeout=30,
                      json={"model": "tiny", "prompt": "count", "max_tokens": 1})


def test_two_gateways_share_one_rate_limit(tiny_model_dir, tmp_path, redis_server):
    env = dict(POLYHEAD_REDIS_URL=redis_server.url, POLYHEAD_API_KEYS='{"team": "sk-shared"}',
               POLYHEAD_RATE_LIMIT_RPM="4", POLYHEAD_BACKEND="echo")
    a = start_gateway(tiny_model_dir, tmp_path / "a.log", **env)
    b = start_gateway(tiny_model_dir, tmp_path / "b.log", **env)
    try:
        if time.time() % 60 > 55:  # keep all six requests inside one rate-limit window
            time.sleep(61 - time.time() % 60)
        codes = [_post(url).status_code for url in (a.url, b.url, a.url, b.url, a.url, b.url)]
        assert codes == [200, 200, 200, 200, 429, 429]
        usage = redis_server.client().hgetall("polyhead:usage:team")
        assert usage["requests"] == "4"
    finally:
        assert stop_gateway(a) == 0 and stop_gateway(b) == 0


def test_redis_restart_mid_traffic_loses_no_counts(tiny_model_dir, tmp_path, redis_server,
                                                   record_property):
    gw = start_gateway(tiny_model_dir, tmp_path / "gw.log", POLYHEAD_REDIS_URL=redis_server.url,
                       POLYHEAD_API_KEYS='{"team": "sk-shared"}', POLYHEAD_BACKEND="echo")
    ok = 0
    stop = threading.Event()
    errors: list[str] = []

    def traffic() -> None:
        nonlocal ok
        while not stop.is_set():
            r = _post(gw.url)
            if r.status_code == 200:
                ok += 1
            else:
                errors.append(r.text)
            time.sleep(0.01)

    t = threading.Thread(target=traffic)
    try:
        t.start()
        time.sleep(1.0)
        redis_server.stop()
        time.sleep(1.0)
        down = httpx.get(f"{gw.url}/readyz", timeout=5)
        record_property("readyz_while_down", down.text)
        assert down.status_code == 200  # still serving, on local state
        assert down.json()["redis"]["up"] is False
        assert down.json()["redis"]["pending_increments"] > 0
        metrics = httpx.get(f"{gw.url}/metrics", timeout=5).text
        assert "polyhead_redis_up 0.0" in metrics
        time.sleep(1.0)
        redis_server.start()
        time.sleep(1.0)
        stop.set()
        t.join(timeout=30)
        body = wait_flushed(gw.url, 10)
        assert body["up"] and body["pending_increments"] == 0, body
        counted = int(redis_server.client().hget("polyhead:usage:team", "requests") or 0)
        assert not errors, errors[:3]
        record_property("served", ok)
        record_property("counted_in_redis", counted)
        assert ok > 20 and counted == ok, (ok, counted)
    finally:
        stop.set()
        assert stop_gateway(gw) == 0
