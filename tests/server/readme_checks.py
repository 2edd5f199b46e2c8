"""What each documented example's answer must be: the request builders and checks that
tests/server/test_readme_examples.py runs against the default install's server."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

HEADS = ("1k", "4k", "8k", "1k+groups", "4k+groups")  # the readings are served by default


@dataclass(frozen=True)
class Example:
    """One request for a feature docs/api.md lists, and what its answer must be."""

    name: str
    path: str
    body: dict | None = None  # None: GET
    status: int = 200
    check: Callable[[httpx.Response], None] | None = None
    headers: dict = field(default_factory=dict)
    admin: bool = False


def chat(content: str = "What is the capital of France?", **kw: Any) -> dict:
    return {"model": "tiny", "messages": [{"role": "user", "content": content}],
            "max_tokens": 8, **kw}


def comp(prompt: str = "Hello", **kw: Any) -> dict:
    return {"model": "tiny", "prompt": prompt, "max_tokens": 8, **kw}


# A schema a random-weight model finishes within max_tokens (a pattern, not maxLength: see
# docs/api.md's xgrammar note).
SCHEMA = {"type": "object", "properties": {"city": {"type": "string",
                                                    "pattern": "^[A-Za-z]{1,8}$"}},
          "required": ["city"], "additionalProperties": False}


def text_of(r: httpx.Response) -> str:
    c = r.json()["choices"][0]
    return c["text"] if "text" in c else c["message"]["content"]


def is_schema_json(r: httpx.Response) -> None:
    value = json.loads(text_of(r))
    assert set(value) == {"city"} and re.fullmatch("[A-Za-z]{1,8}", value["city"])


def json_if_finished(r: httpx.Response) -> None:
    if r.json()["choices"][0]["finish_reason"] == "stop":
        assert isinstance(json.loads(text_of(r)), dict)


def one_of(*choices: str) -> Callable[[httpx.Response], None]:
    return lambda r: None if text_of(r) in choices else pytest.fail(f"{text_of(r)!r}")


def matches(pattern: str) -> Callable[[httpx.Response], None]:
    return lambda r: None if re.fullmatch(pattern, text_of(r)) else pytest.fail(f"{text_of(r)!r}")


def on_head(head: str) -> Callable[[httpx.Response], None]:
    def check(r: httpx.Response) -> None:
        assert r.headers["x-polyhead-head"] == head
    return check


def has_keys(*keys: str) -> Callable[[httpx.Response], None]:
    def check(r: httpx.Response) -> None:
        missing = set(keys) - set(r.json())
        assert not missing, f"{missing} missing from {r.text[:300]}"
    return check


def is_sse(*last_types: str) -> Callable[[httpx.Response], None]:
    """Chat and completion chunks then [DONE]; or Responses events, the last of `last_types`."""
    def check(r: httpx.Response) -> None:
        data = [ln[6:] for ln in r.text.splitlines() if ln.startswith("data: ")]
        assert r.headers["content-type"].startswith("text/event-stream")
        if not last_types:
            assert data[-1] == "[DONE]" and all(json.loads(d)["choices"] is not None
                                                for d in data[:-1])
        else:
            assert json.loads(data[-1])["type"] in last_types
    return check


def all_of(*checks: Callable[[httpx.Response], None]) -> Callable[[httpx.Response], None]:
    def check(r: httpx.Response) -> None:
        for c in checks:
            c(r)
    return check


def names_ignored(r: httpx.Response) -> None:
    named = set(r.headers["x-polyhead-ignored-fields"].split(","))
    assert {"user", "metadata", "store", "service_tier"} <= {n.strip() for n in named}


def completion_logprobs(r: httpx.Response) -> None:
    lp = r.json()["choices"][0]["logprobs"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) >= 1
    assert all(len(t) <= 2 for t in lp["top_logprobs"])


def chat_logprobs(r: httpx.Response) -> None:
    content = r.json()["choices"][0]["logprobs"]["content"]
    assert content and all(len(t["top_logprobs"]) == 2 for t in content)


def echoes(prompt: str) -> Callable[[httpx.Response], None]:
    def check(r: httpx.Response) -> None:
        c = r.json()["choices"][0]
        assert c["text"].startswith(prompt) and c["logprobs"]["token_logprobs"][0] is None
    return check


def is_scored(r: httpx.Response) -> None:
    c, usage = r.json()["choices"][0], r.json()["usage"]
    assert c["text"] == "Hello" and c["finish_reason"] == "length"
    assert usage["completion_tokens"] == 0
    assert len(c["logprobs"]["tokens"]) == usage["prompt_tokens"]


def prompt_logprobs(r: httpx.Response) -> None:
    plp = r.json()["choices"][0]["prompt_logprobs"]
    assert plp[0] is None and all(len(p) >= 1 for p in plp[1:])


def usage_is(field_: str, value: int) -> Callable[[httpx.Response], None]:
    def check(r: httpx.Response) -> None:
        assert r.json()["usage"][field_] == value
    return check


def no_turn_markers(r: httpx.Response) -> None:
    text = text_of(r)
    assert not any(m in text for m in ("<|im_start|>", "<|im_end|>", "\nQuestion:"))


def response_text(r: httpx.Response) -> None:
    body = r.json()
    assert body["object"] == "response" and body["status"] in ("completed", "incomplete")
    assert isinstance(body["output"][0]["content"][0]["text"], str)


def lists_models(r: httpx.Response) -> None:
    data = r.json()["data"]
    assert [m["id"] for m in data] == ["tiny", *(f"tiny:{h}" for h in HEADS)]
    assert len({m["max_model_len"] for m in data}) == 1


def is_error(param: str | None = None) -> Callable[[httpx.Response], None]:
    def check(r: httpx.Response) -> None:
        err = r.json()["error"]
        assert set(err) == {"message", "type", "param", "code"} and err["message"]
        if param is not None:
            assert err["param"] == param, err
    return check
