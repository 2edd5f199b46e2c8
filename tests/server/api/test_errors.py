"""Every client error gets an OpenAI-style body and the right status (raw httpx)."""

from __future__ import annotations

import json

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


def test_bad_field_value_is_400_naming_the_field(gateway):
    r = post(gateway, "/v1/completions", json={"model": "tiny", "prompt": "x", "temperature": 9})
    err = assert_error(r, 400, "temperature")
    assert err["code"] == "invalid_value"


def test_missing_field_is_400(gateway):
    r = post(gateway, "/v1/chat/completions", json={"model": "tiny"})
    assert_error(r, 400, "messages")


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
    err = assert_error(r, 400, "max_tokens")
    assert "max_model_len=2048" in err["message"]  # the tiny backbone's context


def test_every_value_past_a_limit_is_one_400(gateway):
    """The one set of limits: /v1/models and /tokenize serve max_model_len, and a request past
    it or past any other limit (the schema's or the gateway's) is a 400 naming the field."""
    models = httpx.get(f"{gateway.url}/v1/models", timeout=30).json()["data"]
    limit = models[0]["max_model_len"]
    assert {m["max_model_len"] for m in models} == {limit}
    tok = post(gateway, "/tokenize", json={"model": "tiny:1k", "prompt": "a b c"}).json()
    assert tok["max_model_len"] == limit
    room = limit - tok["count"]  # the same prompt on the same head, BOS included
    chat = {"model": "tiny", "messages": [{"role": "user", "content": "x"}]}
    for route, body, param in (
            ("/v1/completions", {"model": "tiny:1k", "prompt": "a b c",
                                 "max_tokens": room + 1}, "max_tokens"),
            ("/v1/completions", {"model": "tiny", "prompt": "x", "max_tokens": limit + 1},
             "max_tokens"),
            ("/v1/chat/completions", {**chat, "max_completion_tokens": limit + 1},
             "max_completion_tokens"),
            ("/v1/completions", {"model": "tiny", "prompt": "x", "n": 9}, "n"),
            ("/v1/completions", {"model": "tiny", "prompt": "x", "logprobs": 21}, "logprobs"),
            ("/v1/chat/completions", {**chat, "top_logprobs": 21, "logprobs": True},
             "top_logprobs"),
            ("/v1/completions", {"model": "tiny", "prompt": "x", "stop": list("abcde")},
             "stop"),
            ("/v1/completions", {"model": "tiny", "prompt": "x", "max_tokens": -1},
             "max_tokens")):
        assert_error(post(gateway, route, json=body), 400, param)
    fits = post(gateway, "/v1/completions", json={"model": "tiny:1k", "prompt": "a b c",
                                                  "max_tokens": 1, "ignore_eos": True})
    assert fits.status_code == 200, fits.text


def test_max_tokens_zero_is_served_only_to_score_an_echoed_prompt(gateway):
    body = {"model": "tiny:1k", "prompt": "a b c", "max_tokens": 0}
    err = assert_error(post(gateway, "/v1/completions", json=body), 400, "max_tokens")
    assert "echo" in err["message"]
    chat = {"model": "tiny", "messages": [{"role": "user", "content": "x"}], "max_tokens": 0}
    assert_error(post(gateway, "/v1/chat/completions", json=chat), 400, "max_tokens")
    for stream in (False, True):
        r = post(gateway, "/v1/completions",
                 json={**body, "echo": True, "logprobs": 0, "stream": stream,
                       **({"stream_options": {"include_usage": True}} if stream else {})})
        assert r.status_code == 200, r.text
        if stream:
            chunks = [json.loads(line[6:]) for line in r.text.splitlines()
                      if line.startswith("data: {")]
            choice = chunks[0]["choices"][0]
            assert [c["choices"] for c in chunks[1:]] == [[]]  # then the usage chunk alone
            usage = chunks[-1]["usage"]
        else:
            choice, usage = r.json()["choices"][0], r.json()["usage"]
        assert choice["text"] == "a b c" and choice["finish_reason"] == "length"
        lp = choice["logprobs"]
        # Every prompt token, the first (BOS) without a logprob, as vLLM echoes it.
        assert len(lp["tokens"]) == usage["prompt_tokens"] and lp["token_logprobs"][0] is None
        assert all(x <= 0 for x in lp["token_logprobs"][1:])
        assert usage["completion_tokens"] == 0


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
