"""POST /v1/responses (text in, text out) through a real uvicorn process and the official
client's `responses.create`, streamed and not."""

from __future__ import annotations

import httpx
import openai
import pytest

pytestmark = pytest.mark.integration

MODEL = "tiny"


@pytest.fixture
def client(gateway) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="unused", max_retries=0)


def test_string_input_with_instructions_equals_the_chat_it_describes(client):
    r = client.responses.create(model=f"{MODEL}:4k", input="Tell me a story",
                                instructions="be brief", max_output_tokens=8, temperature=0)
    chat = client.chat.completions.create(
        model=f"{MODEL}:4k", max_tokens=8, temperature=0,
        messages=[{"role": "system", "content": "be brief"},
                  {"role": "user", "content": "Tell me a story"}])
    assert r.object == "response" and r.id.startswith("resp_")
    assert r.output_text == chat.choices[0].message.content
    assert r.usage.input_tokens == chat.usage.prompt_tokens
    assert r.usage.output_tokens == chat.usage.completion_tokens == 8
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"


def test_message_list_input_and_routed_head(client):
    raw = client.responses.with_raw_response.create(
        model=MODEL, max_output_tokens=4, metadata={"k": "v"},
        input=[{"role": "developer", "content": "answer"},
               {"role": "user", "content": [{"type": "input_text", "text": "hi"}]},
               {"type": "message", "role": "assistant", "content": "hello"},
               {"role": "user", "content": "again"}])
    assert raw.headers["x-polyhead-head"] in ("1k", "4k", "8k")
    assert raw.headers["x-polyhead-ignored-fields"] == "metadata"
    r = raw.parse()
    assert r.output[0].role == "assistant" and r.output[0].content[0].type == "output_text"
    assert r.usage.output_tokens <= 4


def test_streaming_events(client):
    kinds, text, final = [], "", None
    for ev in client.responses.create(model=f"{MODEL}:1k", input="hello",
                                      max_output_tokens=6, stream=True):
        kinds.append(ev.type)
        if ev.type == "response.output_text.delta":
            text += ev.delta
        if ev.type in ("response.completed", "response.incomplete"):
            final = ev.response
    assert kinds[:4] == ["response.created", "response.in_progress",
                         "response.output_item.added", "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done",
                          "response.output_item.done", "response.incomplete"]
    assert final is not None and final.output_text == text
    assert final.usage.output_tokens == 6


def test_stream_matches_non_stream(client):
    args = dict(model=f"{MODEL}:8k", input="The city", max_output_tokens=10, temperature=0)
    whole = client.responses.create(**args)
    streamed = "".join(ev.delta for ev in client.responses.create(**args, stream=True)
                       if ev.type == "response.output_text.delta")
    assert streamed == whole.output_text


@pytest.mark.parametrize(("extra", "param"), [
    ({"previous_response_id": "resp_123"}, "previous_response_id"),
    ({"tools": [{"type": "function", "name": "f", "parameters": {}}]}, "tools"),
    ({"text": {"format": {"type": "json_object"}}}, "text"),
    ({"input": [{"type": "function_call_output", "call_id": "c", "output": "x"}]}, "input.0"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
     "input.0.content.0"),
    ({"frobnicate": 1}, "frobnicate"),
])
def test_unsupported_parts_are_clear_400s(gateway, extra, param):
    r = httpx.post(f"{gateway.url}/v1/responses", timeout=30,
                   json={"model": MODEL, "input": "x", **extra})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


def test_sdk_raises_bad_request_for_previous_response_id(client):
    with pytest.raises(openai.BadRequestError):
        client.responses.create(model=MODEL, input="x", previous_response_id="resp_1")
