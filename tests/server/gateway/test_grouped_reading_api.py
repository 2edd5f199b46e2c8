"""A split head's two-level reading through the real gateway (grouped_heads): listed and
pinnable as a head of its own, streamed and counted like any head, priced by the router, and
never handed a request it cannot serve."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from tests.conftest import ADMIN_TOKEN, Gateway, start_gateway, stop_gateway

pytestmark = pytest.mark.integration
AUTH = {"authorization": f"Bearer {ADMIN_TOKEN}"}
READING = "1k+groups"


@pytest.fixture(scope="module")
def gw(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    g = start_gateway(tiny_model_dir, tmp_path_factory.mktemp("reading") / "gw.log",
                      POLYHEAD_GROUPED_HEADS='["1k"]', POLYHEAD_ADMIN_TOKEN=ADMIN_TOKEN,
                      POLYHEAD_PROMPT_BPB="on")
    yield g
    stop_gateway(g)


def test_the_reading_is_listed_and_serves_text_with_logprobs(gw: Gateway) -> None:
    client = openai.OpenAI(base_url=f"{gw.url}/v1", api_key="x", max_retries=0)
    ids = [m.id for m in client.models.list().data]
    assert f"tiny:{READING}" in ids
    r = client.completions.create(model=f"tiny:{READING}", prompt="hello world", max_tokens=6,
                                  temperature=0, logprobs=0)
    choice = r.choices[0]
    assert choice.finish_reason == "length" and r.usage is not None
    assert r.usage.completion_tokens == 6
    assert choice.logprobs is not None and len(choice.logprobs.token_logprobs) == 6
    assert all(lp is not None and lp <= 0 for lp in choice.logprobs.token_logprobs)
    again = client.completions.create(model=f"tiny:{READING}", prompt="hello world",
                                      max_tokens=6, temperature=0, stream=True)
    assert "".join(c.choices[0].text for c in again) == choice.text
    metrics = httpx.get(f"{gw.url}/metrics", timeout=10).text
    assert f'head="{READING}"' in metrics


def test_what_the_reading_cannot_serve_is_a_400_and_never_routed_to_it(gw: Gateway) -> None:
    body = {"prompt": "hello world", "max_tokens": 4, "logprobs": 2}
    r = httpx.post(f"{gw.url}/v1/completions", json={**body, "model": f"tiny:{READING}"},
                   timeout=30)
    assert r.status_code == 400 and "top_logprobs" in r.json()["error"]["message"]
    before = httpx.get(f"{gw.url}/admin/policy", headers=AUTH, timeout=10).json()
    try:
        r = httpx.put(f"{gw.url}/admin/policy", headers=AUTH, timeout=10,
                      json={"name": "pinned", "params": {"head": READING}})
        assert r.status_code == 200, r.text
        plain = httpx.post(f"{gw.url}/v1/completions", timeout=30,
                           json={"model": "tiny", "prompt": "hello", "max_tokens": 3})
        assert plain.status_code == 200 and plain.headers["x-polyhead-head"] == READING
        r = httpx.post(f"{gw.url}/v1/completions", json={**body, "model": "tiny"}, timeout=30)
        assert r.status_code == 400 and "two-level reading" in r.json()["error"]["message"]
        r = httpx.put(f"{gw.url}/admin/policy", headers=AUTH, timeout=10,
                      json={"name": "cost", "params": {}})
        assert r.status_code == 200, r.text
        for bias in ({}, {"logit_bias": {"5": 1.0}}):
            r = httpx.post(f"{gw.url}/v1/completions", json={**body, "model": "tiny", **bias},
                           timeout=30)
            assert r.status_code == 200 and r.headers["x-polyhead-head"] != READING
    finally:
        httpx.put(f"{gw.url}/admin/policy", headers=AUTH, timeout=10,
                  json={"name": before["name"], "params": before["params"]})


def test_the_router_prices_the_reading(gw: Gateway) -> None:
    httpx.post(f"{gw.url}/v1/completions", timeout=30,
               json={"model": "tiny", "prompt": "hello there", "max_tokens": 3})
    decisions = httpx.get(f"{gw.url}/admin/decisions", headers=AUTH, timeout=10).json()
    last = decisions["decisions"][0]  # newest first
    assert READING in last["request"]["heads"]  # tokenized for it, natively
    assert READING in last["reason"]  # priced in the regime's table
