"""/metrics parses with prometheus_client's parser and its counters move with traffic."""

from __future__ import annotations

import httpx
import pytest

from tests.server.metrics_util import scrape

pytestmark = pytest.mark.integration


def test_counters_move(gateway):
    before = scrape(gateway.url)
    r = httpx.post(f"{gateway.url}/v1/completions", timeout=30,
                   json={"model": "tiny:1k", "prompt": "count me", "max_tokens": 5,
                         "temperature": 0})
    assert r.status_code == 200
    after = scrape(gateway.url)

    def delta(name: str, **labels: str) -> float:
        key = (name, tuple(sorted(labels.items())))
        return after.get(key, 0.0) - before.get(key, 0.0)

    usage = r.json()["usage"]
    assert delta("polyhead_requests_total", route="/v1/completions", head="1k",
                 policy="request_pin", status="200") == 1
    assert delta("polyhead_tokens_total", head="1k", direction="prompt") == usage["prompt_tokens"]
    assert delta("polyhead_tokens_total", head="1k",
                 direction="generated") == usage["completion_tokens"]
    assert delta("polyhead_text_bytes_total", head="1k", direction="prompt") == len(b"count me")
    assert delta("polyhead_request_duration_seconds_count", head="1k") == 1
    assert delta("polyhead_time_to_first_token_seconds_count", head="1k") == 1
    assert delta("polyhead_lambda", head="1k") > 0
    assert delta("polyhead_lambda", head="all") > 0
    assert ("polyhead_running_requests", (("head", "8k"),)) in after
    assert ("polyhead_waiting_requests", (("head", "4k"),)) in after
    assert after[("polyhead_policy_version", ())] >= 1
    assert any(k[0] == "polyhead_policy_info" for k in after)
