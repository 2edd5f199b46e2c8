"""Client keys, per-key rate limits, request-shape limits, CORS and the request id, on one
gateway configured with keys from a file and small limits."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest

from tests.conftest import Gateway, start_gateway, stop_gateway

pytestmark = pytest.mark.integration
ALICE = {"authorization": "Bearer sk-alice-123"}
BOB = {"authorization": "Bearer sk-bob-456"}


@pytest.fixture(scope="module")
def keyed(tiny_model_dir, tmp_path_factory) -> Iterator[Gateway]:
    d = tmp_path_factory.mktemp("keyed")
    keys = d / "keys.json"
    keys.write_text(json.dumps({"alice": "sk-alice-123", "bob": "sk-bob-456"}))
    gw = start_gateway(tiny_model_dir, d / "gw.log", POLYHEAD_API_KEYS_FILE=str(keys),
                       POLYHEAD_RATE_LIMIT_RPM="3", POLYHEAD_MAX_N="2",
                       POLYHEAD_MAX_PROMPT_BYTES="200", POLYHEAD_LOG_FORMAT="json",
                       POLYHEAD_CACHE_DIR=str(d / "cache"))
    yield gw
    assert stop_gateway(gw) == 0


def _post(gw: Gateway, headers: dict, **body) -> httpx.Response:
    return httpx.post(f"{gw.url}/v1/completions", headers=headers, timeout=30,
                      json={"model": "tiny", "prompt": "secret prompt text", "max_tokens": 2,
                            **body})


def test_missing_or_wrong_key_is_401(keyed):
    r = _post(keyed, {})
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    assert _post(keyed, {"authorization": "Bearer sk-alice-124"}).status_code == 401
    assert httpx.get(f"{keyed.url}/healthz", timeout=5).status_code == 200


def test_shape_limits_are_clear_4xx(keyed):
    too_many = _post(keyed, BOB, n=3)
    assert too_many.status_code == 400 and too_many.json()["error"]["param"] == "n"
    long = _post(keyed, BOB, prompt="x" * 201)
    assert long.status_code == 400 and long.json()["error"]["param"] == "prompt"
    huge = _post(keyed, BOB, max_tokens=10**6)
    assert huge.status_code == 400 and huge.json()["error"]["param"] == "max_tokens"
    stops = _post(keyed, BOB, stop=["a", "b", "c", "d", "e"])
    assert stops.status_code == 400 and stops.json()["error"]["param"] == "stop"


def test_rate_limit_per_key_then_429_with_retry_after(keyed):
    codes = [_post(keyed, ALICE).status_code for _ in range(3)]
    assert codes == [200, 200, 200]
    over = _post(keyed, ALICE)
    assert over.status_code == 429, over.text
    assert over.json()["error"]["type"] == "rate_limit_error"
    assert 1 <= int(over.headers["retry-after"]) <= 60
    metrics = httpx.get(f"{keyed.url}/metrics", timeout=5).text
    assert 'polyhead_admission_rejections_total{reason="rate_limit"}' in metrics
    assert 'polyhead_client_requests_total{key="alice"} 3.0' in metrics


def test_request_id_is_honoured_and_logged_without_prompt(keyed):
    r = _post(keyed, BOB, **{})
    generated = r.headers["x-request-id"]
    assert r.status_code == 200 and generated == r.json()["id"]
    mine = httpx.post(f"{keyed.url}/v1/completions", timeout=30,
                      headers={**BOB, "x-request-id": "trace-abc.123"},
                      json={"model": "tiny:8k", "prompt": "secret prompt text", "max_tokens": 2})
    assert mine.headers["x-request-id"] == "trace-abc.123"
    bad = httpx.get(f"{keyed.url}/healthz", headers={"x-request-id": "x" * 500}, timeout=5)
    assert bad.headers["x-request-id"].startswith("req-")
    lines = [json.loads(line) for line in keyed.log().splitlines() if line.startswith("{")]
    ids = {line.get("request_id") for line in lines}
    assert "trace-abc.123" in ids and generated in ids
    assert "secret prompt text" not in keyed.log()
    assert "sk-alice-123" not in keyed.log() and "sk-bob-456" not in keyed.log()


def test_cors_is_off_by_default(keyed):
    r = httpx.options(f"{keyed.url}/v1/completions", timeout=5,
                      headers={"origin": "https://evil.example",
                               "access-control-request-method": "POST"})
    assert "access-control-allow-origin" not in r.headers
