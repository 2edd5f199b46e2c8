"""Every client error gets an OpenAI-style body and the right status (raw httpx)."""

from __future__ import annotations

import httpx
import pytest

pytestmark = pytest.mark.integration


def post(gateway, path: str, **kw) -> httpx.Response:
    return httpx.post(f"{gateway.url}{path}", timeout=30, **kw)


def assert_error(r: httpx.Response, status: int, param: str | None = None) -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["message"]
    if param is not None:
        assert err["param"] == param
    return err


def test_malformed_json_is_400(gateway):
    r = post(gateway, "/v1/completions", content=b'{"model": "tiny", "prompt": ',
             headers={"content-type": "application/json"})
    assert_error(r, 400)


def test_bad_field_value_is_422_naming_the_field(gateway):
    r = post(gateway, "/v1/completions", json={"model": "tiny", "prompt": "x", "temperature": 9})
    assert_error(r, 422, "temperature")


def test_missing_field_is_422(gateway):
    r = post(gateway, "/v1/chat/completions", json={"model": "tiny"})
    assert_error(r, 422, "messages")


def test_unknown_field_is_400_naming_the_field(gateway):
    r = post(gateway, "/v1/completions", json={"model": "tiny", "prompt": "x", "tempreature": 1})
    err = assert_error(r, 400, "tempreature")
    assert "unknown field 'tempreature'" in err["message"]


def test_unknown_model_and_head_are_404(gateway):
    r = post(gateway, "/v1/completions", json={"model": "gpt-4", "prompt": "x"})
    assert_error(r, 404, "model")
    r = post(gateway, "/v1/completions", json={"model": "tiny:999k", "prompt": "x"})
    err = assert_error(r, 404, "model")
    assert "1k" in err["message"]  # lists the heads that do exist


def test_body_over_limit_is_413(gateway):
    r = post(gateway, "/v1/completions", json={"model": "tiny", "prompt": "x" * 70_000})
    assert_error(r, 413)


def test_body_over_limit_without_content_length_is_413(gateway):
    def chunks():
        yield b'{"model": "tiny", "prompt": "'
        for _ in range(80):
            yield b"y" * 1000
        yield b'"}'

    r = post(gateway, "/v1/completions", content=chunks(),
             headers={"content-type": "application/json"})
    assert_error(r, 413)


def test_max_tokens_over_limit_is_400(gateway):
    r = post(gateway, "/v1/completions", json={"model": "tiny", "prompt": "x", "max_tokens": 10**6})
    assert_error(r, 400, "max_tokens")


def test_unsupported_options_are_400(gateway):
    for extra, param in (({"logit_bias": {"one": 2.0}}, "logit_bias"),
                         ({"best_of": 2}, "best_of"),
                         ({"suffix": "y"}, "suffix"),
                         ({"stream_options": {"include_usage": True}}, "stream_options")):
        r = post(gateway, "/v1/completions", json={"model": "tiny", "prompt": "x", **extra})
        assert_error(r, 400, param)


def test_chat_tools_are_400(gateway):
    r = post(gateway, "/v1/chat/completions",
             json={"model": "tiny", "messages": [{"role": "user", "content": "x"}],
                   "tools": [{"type": "function", "function": {"name": "f"}}]})
    assert_error(r, 400, "tools")


def test_unknown_route_is_404_json(gateway):
    r = httpx.get(f"{gateway.url}/v1/nope", timeout=10)
    assert_error(r, 404)
