"""Every top-level field of the official SDK's "create with all params" chat request, one at
a time on a valid body: accepted (used), ignored (named in x-polyhead-ignored-fields), or
rejected with a 400 naming it. The sample values are those the SDK's own tests send."""

from __future__ import annotations

import httpx
import pytest

from server.api.ignored_fields import HEADER

pytestmark = pytest.mark.integration

FUNCTION = {"name": "name", "description": "description", "parameters": {"foo": "bar"}}
# field -> (sample value, outcome, the error's param for a rejection)
CHAT_FIELDS: dict[str, tuple[object, str, str | None]] = {
    "audio": ({"format": "wav", "voice": "alloy"}, "rejected", "audio"),
    "frequency_penalty": (-2, "accepted", None),
    "function_call": ("none", "rejected", "function_call"),
    "functions": ([FUNCTION], "rejected", "functions"),
    "logit_bias": ({"foo": 0}, "rejected", "logit_bias"),
    "logprobs": (True, "accepted", None),
    "max_completion_tokens": (2, "accepted", None),
    "max_tokens": (2, "accepted", None),
    "metadata": ({"foo": "string"}, "ignored", None),
    "modalities": (["text", "audio"], "rejected", "modalities"),
    "n": (1, "accepted", None),
    "parallel_tool_calls": (True, "ignored", None),
    "prediction": ({"content": "string", "type": "content"}, "ignored", None),
    "presence_penalty": (-2, "accepted", None),
    "response_format": ({"type": "text"}, "accepted", None),
    "seed": (-9007199254740991, "accepted", None),
    "service_tier": ("auto", "ignored", None),
    "stop": ("string", "accepted", None),
    "store": (True, "ignored", None),
    "stream": (False, "accepted", None),
    "stream_options": ({"include_usage": True}, "rejected", "stream_options"),  # stream off
    "temperature": (1, "accepted", None),
    "tool_choice": ("none", "accepted", None),
    "tools": ([{"type": "function", "function": {**FUNCTION, "strict": True}}], "rejected",
              "tools"),
    "top_logprobs": (0, "accepted", None),
    "top_p": (1, "accepted", None),
    "user": ("user-1234", "ignored", None),
    # Newer documented fields, and one nobody documents.
    "reasoning_effort": ("low", "ignored", None),
    "prompt_cache_key": ("k", "ignored", None),
    "safety_identifier": ("s", "ignored", None),
    "web_search_options": ({}, "rejected", "web_search_options"),
    "frobnicate": (1, "rejected", "frobnicate"),
}


@pytest.mark.parametrize("field", sorted(CHAT_FIELDS))
def test_chat_field(gateway, field):
    value, outcome, param = CHAT_FIELDS[field]
    body = {"model": "tiny", "max_tokens": 2,
            "messages": [{"role": "system", "content": "string", "name": "name"}], field: value}
    r = httpx.post(f"{gateway.url}/v1/chat/completions", json=body, timeout=30)
    if outcome == "rejected":
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["param"] == param and err["message"]
        if field != "frobnicate":
            assert "unknown field" not in err["message"]  # documented: says why instead
        return
    assert r.status_code == 200, r.text
    listed = r.headers.get(HEADER, "").split(", ")
    assert (field in listed) == (outcome == "ignored")
