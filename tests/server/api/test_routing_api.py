"""Routing through the real server: decision records, λ forecast and persistence, KV 429."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from tests.conftest import ADMIN_TOKEN, start_gateway, stop_gateway

pytestmark = pytest.mark.integration
AUTH = {"authorization": f"Bearer {ADMIN_TOKEN}"}


def _complete(url: str, prompt: str = "hello", max_tokens: int = 4) -> httpx.Response:
    return httpx.post(f"{url}/v1/completions", timeout=60,
                      json={"model": "tiny", "prompt": prompt, "max_tokens": max_tokens})


def test_decisions_are_recorded_and_served(gateway) -> None:
    for i in range(3):
        assert _complete(gateway.url, f"decide {i}").status_code == 200
    assert httpx.get(f"{gateway.url}/admin/decisions", timeout=10).status_code == 401
    r = httpx.get(f"{gateway.url}/admin/decisions", params={"limit": 2}, headers=AUTH,
                  timeout=10)
    assert r.status_code == 200, r.text
    body = r.json()
    assert len(body["decisions"]) == 2 and body["total"] >= 3
    d = body["decisions"][0]
    assert {"policy", "version", "inputs", "costs", "head", "code", "reason"} <= set(d)
    assert {"batch", "lambda", "queue"} <= set(d["inputs"])
    metrics = httpx.get(f"{gateway.url}/metrics", timeout=10).text
    assert 'polyhead_decisions_total{head="' in metrics and 'reason="' in metrics
    assert 'polyhead_live_batch{head="all",kind="smoothed"}' in metrics
    assert "polyhead_head_max_batch{" in metrics


def _accounted_heads(url: str, timeout_s: float = 10.0) -> dict:
    """The λ view's heads once the finished request is counted: a response reaches the
    client before the gateway's accounting of it runs."""
    deadline = time.monotonic() + timeout_s
    while True:
        heads = httpx.get(f"{url}/admin/lambda", headers=AUTH, timeout=10).json()["heads"]
        if sum(v["served_bytes"] for v in heads.values()) > 0 or time.monotonic() > deadline:
            return heads
        time.sleep(0.05)


def test_lambda_forecast_and_counters_survive_a_restart(tiny_model_dir, tmp_path) -> None:
    env = {"POLYHEAD_ADMIN_TOKEN": ADMIN_TOKEN, "POLYHEAD_CACHE_DIR": str(tmp_path / "cache"),
           "POLYHEAD_LAMBDA_SYNC_S": "0.2"}
    gw = start_gateway(tiny_model_dir, tmp_path / "a.log", **env)
    try:
        assert _complete(gw.url).status_code == 200
        bad = httpx.put(f"{gw.url}/admin/lambda", headers=AUTH, json={"forecast": -1},
                        timeout=10)
        assert bad.status_code == 400
        r = httpx.put(f"{gw.url}/admin/lambda", headers=AUTH, json={"forecast": 5.0},
                      timeout=10)
        assert r.status_code == 200 and r.json()["effective"] == 5.0
        served = _accounted_heads(gw.url)
    finally:
        assert stop_gateway(gw) == 0
    gw = start_gateway(tiny_model_dir, tmp_path / "b.log", **env)
    try:
        view = httpx.get(f"{gw.url}/admin/lambda", headers=AUTH, timeout=10).json()
        assert view["forecast"] == 5.0 and view["measured"] > 0
        assert {h: v["served_bytes"] for h, v in view["heads"].items()} == \
            {h: v["served_bytes"] for h, v in served.items()}
    finally:
        assert stop_gateway(gw) == 0


def test_kv_budget_full_answers_429_with_retry_after(tiny_model_dir, tmp_path) -> None:
    # 20 blocks of 16 tokens; one request of max_tokens 250 reserves 16 of them, so a
    # second one cannot fit while the first runs; with no queue it is refused at once.
    gw = start_gateway(tiny_model_dir, tmp_path / "gw.log", POLYHEAD_ADMIN_TOKEN=ADMIN_TOKEN,
                       POLYHEAD_CACHE_DIR=str(tmp_path / "cache"),
                       POLYHEAD_ADMISSION_KV_BLOCKS="20", POLYHEAD_ADMISSION_QUEUE="0",
                       POLYHEAD_POLICY='{"name": "pinned", "params": {"head": "1k"}}')

    async def burst() -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=120) as c:
            return await asyncio.gather(*(
                c.post(f"{gw.url}/v1/completions",
                       json={"model": "tiny", "prompt": f"burst {i}", "max_tokens": 250})
                for i in range(4)))

    try:
        responses = asyncio.run(burst())
        codes = sorted(r.status_code for r in responses)
        assert codes[0] == 200 and codes[-1] == 429 and set(codes) <= {200, 429}, codes
        refused = next(r for r in responses if r.status_code == 429)
        assert int(refused.headers["retry-after"]) >= 1
        err = refused.json()["error"]
        assert err["type"] == "rate_limit_error" and "KV-cache limit" in err["message"]
        view = httpx.get(f"{gw.url}/admin/admission", headers=AUTH, timeout=10).json()
        assert view["enabled"] and view["total_blocks"] == 20 and view["reserved_blocks"] == 0
        metrics = httpx.get(f"{gw.url}/metrics", timeout=10).text
        assert 'polyhead_admission_rejections_total{reason="kv_budget"}' in metrics
    finally:
        assert stop_gateway(gw) == 0


def test_session_affinity_through_the_server(gateway) -> None:
    import openai

    client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="x", max_retries=0)
    heads = []
    for turn in ("a first turn", "a second, longer turn of the same conversation " * 4):
        raw = client.chat.completions.with_raw_response.create(
            model="tiny", messages=[{"role": "user", "content": turn}], max_tokens=2,
            extra_headers={"x-session-id": "conversation-7"})
        heads.append(raw.headers["x-polyhead-head"])
        d = httpx.get(f"{gateway.url}/admin/decisions", params={"limit": 1}, headers=AUTH,
                      timeout=10).json()["decisions"][0]
        assert d["request"]["session"] is True and d["head"] == heads[-1]
    assert heads[0] == heads[1]
    r = httpx.post(f"{gateway.url}/v1/completions", headers={"x-session-id": "x" * 300},
                   json={"model": "tiny", "prompt": "hi", "max_tokens": 1}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "x-session-id"
