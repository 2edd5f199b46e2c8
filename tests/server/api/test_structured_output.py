"""Structured output through a real uvicorn process on the tiny model and the official
client: response_format (json_object, json_schema) and vLLM's structured_outputs / guided_*
fields, on every head."""

from __future__ import annotations

import json
import re

import httpx
import jsonschema
import openai
import pytest

pytestmark = pytest.mark.integration

MODEL = "tiny"
HEADS = ("1k", "4k", "8k")
# Bounded, so a random-weight model finishes within max_tokens: a real model needs no bounds.
# The string is bounded by a pattern, not maxLength: xgrammar 0.2.8 compiles a maxLength
# string to any character but quote, backslash and newlines, so control characters (which
# strict JSON forbids) slip through.
SCHEMA = {"type": "object",
          "properties": {"city": {"type": "string", "pattern": "^[A-Za-z ]{1,10}$"},
                         "rank": {"type": "integer", "minimum": 0, "maximum": 99},
                         "open": {"type": "boolean"}},
          "required": ["city", "rank", "open"], "additionalProperties": False}


@pytest.fixture
def client(gateway) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="unused", max_retries=0)


@pytest.mark.parametrize("head", HEADS)
def test_fifty_schema_constrained_completions_validate(client, head):
    fmt = {"type": "json_schema", "json_schema": {"name": "city", "schema": SCHEMA}}
    texts = []
    for seed in range(10):
        c = client.chat.completions.create(
            model=f"{MODEL}:{head}", messages=[{"role": "user", "content": "A city?"}],
            response_format=fmt, n=5, seed=seed, temperature=1.0, max_tokens=64)
        assert all(ch.finish_reason == "stop" for ch in c.choices)
        texts += [ch.message.content for ch in c.choices]
    assert len(texts) == 50
    for text in texts:
        jsonschema.validate(json.loads(text), SCHEMA)


def test_json_object_and_vllm_fields(client, gateway):
    c = client.chat.completions.create(model=f"{MODEL}:8k", max_tokens=96, temperature=0,
                                       messages=[{"role": "user", "content": "json please"}],
                                       response_format={"type": "json_object"})
    if c.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(c.choices[0].message.content), dict)
    choice = client.completions.create(model=f"{MODEL}:4k", prompt="yes or no?",
                                       max_tokens=8, extra_body={"guided_choice": ["yes", "no"]})
    assert choice.choices[0].text in ("yes", "no")
    regex = client.completions.create(
        model=f"{MODEL}:1k", prompt="a date", max_tokens=16,
        extra_body={"structured_outputs": {"regex": r"20[0-9]{2}-[01][0-9]"}})
    assert re.fullmatch(r"20[0-9]{2}-[01][0-9]", regex.choices[0].text)
    streamed = "".join(
        ch.choices[0].text for ch in client.completions.create(
            model=f"{MODEL}:1k", prompt="x", max_tokens=32, stream=True, seed=4,
            extra_body={"guided_json": SCHEMA}) if ch.choices)
    jsonschema.validate(json.loads(streamed), SCHEMA)


@pytest.mark.parametrize("body", [
    {"response_format": {"type": "json_schema", "json_schema": {"schema": "not json"}}},
    {"response_format": {"type": "xml"}},
    {"guided_regex": "(unclosed"},
    {"guided_choice": []},
    {"structured_outputs": {"yaml": "x"}},
    {"guided_regex": "a", "guided_choice": ["b"]},
])
def test_bad_structured_requests_are_400(gateway, body):
    r = httpx.post(f"{gateway.url}/v1/completions",
                   json={"model": MODEL, "prompt": "x", "max_tokens": 4, **body}, timeout=60)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["message"]


# The library's log prefix, "[hh:mm:ss] /build/path/file.cc:NNN: ", must not reach a client.
LIBRARY_TRACE = re.compile(r"\[\d{1,2}:\d{2}:\d{2}\]|\.cc\b|:\d+:|/project/")


@pytest.mark.parametrize(("route", "body", "message", "param"), [
    ("chat/completions",
     {"response_format": {"type": "json_schema", "json_schema": {
         "name": "x", "schema": {"type": "object",
                                 "properties": {"a": {"type": "nonsense"}}}}}},
     'response_format.json_schema: unsupported type "nonsense"', "response_format"),
    ("completions", {"guided_json": {"type": "nonsense"}},
     'guided_json: unsupported type "nonsense"', "guided_json"),
    ("completions", {"structured_outputs": {"json": {"$ref": "#/defs/x"}}},
     'structured_outputs.json: $ref "#/defs/x" does not resolve: no "defs"',
     "structured_outputs"),
    ("completions", {"guided_regex": "(unclosed"},
     "guided_regex: regex parsing error at position 10: The parenthesis is not closed.",
     "guided_regex"),
])
def test_a_bad_schema_is_a_400_in_the_requests_terms(gateway, route, body, message, param):
    prompt = ({"messages": [{"role": "user", "content": "x"}]} if route.startswith("chat")
              else {"prompt": "x"})
    r = httpx.post(f"{gateway.url}/v1/{route}",
                   json={"model": MODEL, "max_tokens": 4, **prompt, **body}, timeout=60)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["message"] == message
    assert error["param"] == param
    assert not LIBRARY_TRACE.search(error["message"]), error["message"]
