"""Per-key tokens/min: charged up front (prompt + max_tokens), corrected to the tokens used
when the request ends, across two replicas sharing one Redis (echo backend, stop strings
end generation early and deterministically)."""

from __future__ import annotations

import json
import time

import httpx
import pytest

from server.ops.ratelimit import WINDOW_S
from tests.conftest import start_gateway, stop_gateway

pytestmark = pytest.mark.integration
ALICE = {"authorization": "Bearer sk-alice-123"}
TPM = 1000
MAX_TOKENS = 400  # two requests' up-front charges fill the minute; their use does not


def _post(url: str, stream: bool = False) -> dict:
    body = {"model": "tiny:4k", "prompt": "alpha beta gamma delta", "max_tokens": MAX_TOKENS,
            "stop": ["gamma"], "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
        with httpx.stream("POST", f"{url}/v1/completions", headers=ALICE, json=body,
                          timeout=30) as r:
            assert r.status_code == 200, r.read()
            chunks = [json.loads(x[6:]) for x in r.iter_lines() if x.startswith("data: {")]
        return chunks[-1]["usage"]
    r = httpx.post(f"{url}/v1/completions", headers=ALICE, json=body, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()["usage"]


def test_tpm_is_corrected_to_tokens_used_across_replicas(tiny_model_dir, tmp_path,
                                                         redis_server):
    keys = tmp_path / "keys.json"
    keys.write_text(json.dumps({"alice": "sk-alice-123"}))
    env = dict(POLYHEAD_API_KEYS_FILE=str(keys), POLYHEAD_RATE_LIMIT_TPM=str(TPM),
               POLYHEAD_BACKEND="echo", POLYHEAD_REDIS_URL=redis_server.url)
    a = start_gateway(tiny_model_dir, tmp_path / "a.log", POLYHEAD_CACHE_DIR=str(tmp_path / "a"),
                      **env)
    b = start_gateway(tiny_model_dir, tmp_path / "b.log", POLYHEAD_CACHE_DIR=str(tmp_path / "b"),
                      **env)
    try:
        while WINDOW_S - time.time() % WINDOW_S < 20:  # all of it inside one minute window
            time.sleep(0.5)
        window = int(time.time() // WINDOW_S)
        used = 0
        for i in range(8):  # 8 x 400 up front would be 3200 > 1000: the refunds let them in
            usage = _post((a, b)[i % 2].url, stream=i % 4 == 3)
            assert usage["completion_tokens"] < MAX_TOKENS
            used += usage["total_tokens"]
        r = redis_server.client()
        charged = r.hgetall(f"polyhead:rl:alice:{window}")
        assert int(charged["tokens"]) == used  # exact: the charge minus every refund
        assert int(charged["requests"]) == 8
        counted = r.hgetall("polyhead:usage:alice")
        assert int(counted["prompt_tokens"]) + int(counted["completion_tokens"]) == used

        # The up-front charge still limits: a request that could use the rest is refused.
        big = httpx.post(f"{a.url}/v1/completions", headers=ALICE, timeout=30, json={
            "model": "tiny:4k", "prompt": "x", "max_tokens": TPM - used + 1})
        assert big.status_code == 429 and "retry-after" in big.headers
    finally:
        assert stop_gateway(a) == 0 and stop_gateway(b) == 0
