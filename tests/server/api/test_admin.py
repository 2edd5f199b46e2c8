"""Admin policy API: auth, validation, and a switch while streams are in flight."""

from __future__ import annotations

import asyncio

import httpx
import openai
import pytest

from tests.conftest import ADMIN_TOKEN, start_gateway, stop_gateway

pytestmark = pytest.mark.integration
AUTH = {"authorization": f"Bearer {ADMIN_TOKEN}"}


def test_admin_requires_the_token(gateway):
    assert httpx.get(f"{gateway.url}/admin/policy", timeout=10).status_code == 401
    bad = httpx.get(f"{gateway.url}/admin/policy", headers={"authorization": "Bearer nope"},
                    timeout=10)
    assert bad.status_code == 401 and bad.json()["error"]["type"] == "authentication_error"
    assert bad.headers["www-authenticate"] == "Bearer"


def test_admin_disabled_without_token_is_403(tiny_model_dir, tmp_path):
    gw = start_gateway(tiny_model_dir, tmp_path / "gw.log")
    try:
        r = httpx.get(f"{gw.url}/admin/policy", headers=AUTH, timeout=10)
        assert r.status_code == 403
        assert r.json()["error"]["code"] == "forbidden"
    finally:
        assert stop_gateway(gw) == 0


def test_invalid_policy_is_rejected_and_names_the_field(gateway):
    r = httpx.put(f"{gateway.url}/admin/policy", headers=AUTH, timeout=10,
                  json={"name": "pinned", "params": {"head": "999k"}})
    assert r.status_code == 400 and "head" in r.json()["error"]["param"]
    r = httpx.put(f"{gateway.url}/admin/policy", headers=AUTH, timeout=10,
                  json={"name": "no-such-policy"})
    assert r.status_code == 400


def test_policy_switch_during_streams_loses_nothing(gateway):
    before = httpx.get(f"{gateway.url}/admin/policy", headers=AUTH, timeout=10).json()
    client = openai.AsyncOpenAI(base_url=f"{gateway.url}/v1", api_key="x", max_retries=0)

    async def stream_one(i: int) -> tuple[str, str | None]:
        resp = await client.completions.create(model="tiny", prompt=f"stream {i}",
                                               max_tokens=40, temperature=0.7, seed=i,
                                               stream=True)
        finish = None
        async for ch in resp:
            finish = ch.choices[0].finish_reason or finish
        return str(i), finish

    async def switch() -> httpx.Response:
        await asyncio.sleep(0.3)
        async with httpx.AsyncClient(timeout=10) as h:
            return await h.put(f"{gateway.url}/admin/policy", headers=AUTH,
                               json={"name": "pinned", "params": {"head": "4k"}})

    async def main():
        return await asyncio.gather(switch(), *(stream_one(i) for i in range(8)))

    put, *streams = asyncio.run(main())
    assert put.status_code == 200, put.text
    after = put.json()
    assert after["name"] == "pinned" and after["version"] == before["version"] + 1
    assert after["changed_by"] == "admin"
    assert all(finish in ("stop", "length") for _, finish in streams)
    # New requests follow the new policy.
    r = httpx.post(f"{gateway.url}/v1/completions", timeout=30,
                   json={"model": "tiny", "prompt": "after", "max_tokens": 2})
    assert r.headers["x-polyhead-head"] == "4k"
    restore = httpx.put(f"{gateway.url}/admin/policy", headers=AUTH, timeout=10,
                        json={"name": before["name"], "params": before["params"]})
    assert restore.status_code == 200
