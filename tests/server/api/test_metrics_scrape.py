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


def test_a_repeated_prompt_is_served_from_the_prefix_cache(gateway):
    import openai

    client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="unused", max_retries=0)
    prompt = "the same long system prompt, repeated word for word. " * 12
    before = scrape(gateway.url)
    # prompt_bpb off: a scored prompt needs every position's hidden state, so it skips the cache.
    runs = [client.completions.create(model="tiny:4k", prompt=prompt, max_tokens=6,
                                      temperature=0, extra_body={"prompt_bpb": False})
            for _ in range(2)]
    after = scrape(gateway.url)

    def delta(name: str) -> float:
        key = (name, (("head", "4k"),))
        return after.get(key, 0.0) - before.get(key, 0.0)

    first, second = (r.usage for r in runs)
    assert first is not None and second is not None
    assert first.prompt_tokens == second.prompt_tokens > 32
    assert first.prompt_tokens_details is not None and second.prompt_tokens_details is not None
    assert first.prompt_tokens_details.cached_tokens == 0
    cached = second.prompt_tokens_details.cached_tokens
    assert cached is not None and 0 < cached < second.prompt_tokens and cached % 16 == 0
    assert runs[0].choices[0].text == runs[1].choices[0].text  # greedy: a hit changes nothing
    assert delta("polyhead_prefix_cache_queries_total") == 2 * first.prompt_tokens
    assert delta("polyhead_prefix_cache_hits_total") == cached
