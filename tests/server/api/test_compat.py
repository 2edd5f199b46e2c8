"""What real clients send: documented fields that do not change generation are accepted and
named in x-polyhead-ignored-fields; unknown fields are a 400; token-id prompts on a pinned
head. Through a real uvicorn process, the official `openai` client and raw httpx."""

from __future__ import annotations

import httpx
import openai
import pytest

from server.api.ignored_fields import HEADER

pytestmark = pytest.mark.integration

MODEL = "tiny"


@pytest.fixture
def client(gateway) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="unused", max_retries=0)


def test_sdk_documented_fields_are_accepted_and_listed(client):
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=3,
        user="u-1", metadata={"team": "a"}, store=False, service_tier="auto",
        parallel_tool_calls=False, reasoning_effort="low", modalities=["text"],
        prompt_cache_key="k", safety_identifier="s")
    assert raw.http_response.status_code == 200
    listed = raw.headers[HEADER].split(", ")
    assert listed == ["user", "metadata", "store", "service_tier", "parallel_tool_calls",
                      "reasoning_effort", "modalities", "prompt_cache_key", "safety_identifier"]
    assert raw.parse().usage.completion_tokens == 3


def test_no_header_when_nothing_is_ignored(client):
    raw = client.completions.with_raw_response.create(model=MODEL, prompt="hi", max_tokens=2)
    assert HEADER not in raw.headers


def test_ignored_fields_on_a_stream(client):
    with client.chat.completions.with_streaming_response.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=2,
            stream=True, metadata={"a": "b"}) as resp:
        assert resp.headers[HEADER] == "metadata"
        assert sum(1 for _ in resp.iter_lines()) > 0


def test_ignored_field_is_logged_once(gateway, client):
    for _ in range(3):
        client.completions.create(model=MODEL, prompt="x", max_tokens=1,
                                  extra_body={"service_tier": "flex"})
    lines = [ln for ln in gateway.log().splitlines()
             if "ignoring request field" in ln and "service_tier" in ln]
    assert len(lines) == 1


def test_unknown_field_through_the_sdk_is_400_naming_it(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}],
                                       extra_body={"frobnicate": True})
    assert e.value.body["param"] == "frobnicate"
    assert "unknown field 'frobnicate'" in e.value.body["message"]


def test_output_changing_options_stay_400(gateway):
    for extra, param in (({"modalities": ["text", "audio"]}, "modalities"),
                         ({"tools": [{"type": "function", "function": {"name": "f"}}],
                           "parallel_tool_calls": True}, "tools")):
        r = httpx.post(f"{gateway.url}/v1/chat/completions", timeout=30, json={
            "model": MODEL, "messages": [{"role": "user", "content": "x"}], **extra})
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] == param


def test_non_text_content_part_is_400(gateway):
    r = httpx.post(f"{gateway.url}/v1/chat/completions", timeout=30, json={
        "model": MODEL, "messages": [{"role": "user", "content": [
            {"type": "text", "text": "look"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}]})
    assert r.status_code == 400, r.text
    assert "image_url" in r.json()["error"]["message"]


# --- token-id prompts -----------------------------------------------------------------------

def test_token_prompt_on_a_pinned_head_matches_its_text(client, tiny_model_dir):
    from heads.checkpoint import load_metadata

    manifest, toks = load_metadata(tiny_model_dir)
    bos = manifest.head("4k").bos_token_id
    ids = toks["4k"].encode("the quick brown fox")
    ids = [bos, *ids] if bos is not None else ids
    by_text = client.completions.create(model=f"{MODEL}:4k", prompt="the quick brown fox",
                                        max_tokens=6, temperature=0, seed=3)
    by_ids = client.completions.create(model=f"{MODEL}:4k", prompt=ids, max_tokens=6,
                                       temperature=0, seed=3)
    assert by_ids.choices[0].text == by_text.choices[0].text
    assert by_ids.usage.prompt_tokens == len(ids) == by_text.usage.prompt_tokens


def test_token_prompt_batch_counts_exactly(client):
    r = client.completions.create(model=f"{MODEL}:1k", prompt=[[5, 6, 7], [8]], max_tokens=2)
    assert r.usage.prompt_tokens == 4  # no BOS added to ids
    assert len(r.choices) == 2


def test_token_prompt_needs_a_pinned_head(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=MODEL, prompt=[1, 2, 3], max_tokens=2)
    assert e.value.body["param"] == "prompt"
    assert "pinned head" in e.value.body["message"]


def test_token_ids_are_range_checked_against_the_heads_vocabulary(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=f"{MODEL}:1k", prompt=[1, 1024], max_tokens=2)
    assert "1024" in e.value.body["message"] and "[0, 1024)" in e.value.body["message"]
    # The same id is inside the 4k head's vocabulary.
    assert client.completions.create(model=f"{MODEL}:4k", prompt=[1, 1024],
                                     max_tokens=1).usage.prompt_tokens == 2
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=f"{MODEL}:1k", prompt=[[1], []], max_tokens=2)
