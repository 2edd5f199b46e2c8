"""vLLM's request extensions through a real uvicorn process on the tiny model: the fields
`vllm bench serve` and lm-eval send, the per-head path prefix and /tokenizer_info."""

from __future__ import annotations

import httpx
import openai
import pytest

pytestmark = pytest.mark.integration

MODEL = "tiny"
VOCAB = {"1k": 1000, "4k": 4000, "8k": 8000}


def post(gateway, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{gateway.url}{path}", json=body, timeout=60)


@pytest.fixture
def client(gateway) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="unused", max_retries=0)


def test_vocab_sizes_are_what_the_tests_assume(gateway):
    sizes = {m["id"].partition(":")[2]: m for m in httpx.get(f"{gateway.url}/v1/models").json()
             ["data"] if ":" in m["id"]}
    for head in VOCAB:
        info = httpx.get(f"{gateway.url}/heads/{head}/tokenizer_info").json()
        assert info["vocab_size"] >= VOCAB[head] and head in sizes


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_ignore_eos_runs_to_max_tokens(client, seed):
    c = client.completions.create(model=MODEL, prompt="a b", max_tokens=32, temperature=1.0,
                                  seed=seed, extra_body={"ignore_eos": True, "min_tokens": 32})
    assert c.usage.completion_tokens == 32
    assert c.choices[0].finish_reason == "length"


def test_stop_token_ids_end_the_choice_and_drop_their_text(client, gateway):
    vocab = httpx.get(f"{gateway.url}/heads/1k/tokenizer_info").json()["vocab_size"]
    every = list(range(vocab))  # whatever comes first stops it
    c = client.completions.create(model=f"{MODEL}:1k", prompt="a b", max_tokens=16,
                                  extra_body={"stop_token_ids": every, "ignore_eos": True})
    assert (c.usage.completion_tokens, c.choices[0].finish_reason, c.choices[0].text) == (
        1, "stop", "")


def test_stop_token_ids_route_only_to_heads_that_hold_them(gateway):
    body = {"model": MODEL, "prompt": "a b", "max_tokens": 2, "stop_token_ids": [5000]}
    r = post(gateway, "/v1/completions", body)
    assert r.status_code == 200, r.text
    assert r.headers["x-polyhead-head"] == "8k"
    r = post(gateway, "/v1/completions", {**body, "model": f"{MODEL}:1k"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "stop_token_ids"
    assert "5000" in r.json()["error"]["message"]
    r = post(gateway, "/v1/completions", {**body, "stop_token_ids": [10**6]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "stop_token_ids"


def test_include_stop_str_in_output(client):
    kw = dict(model=f"{MODEL}:1k", prompt="x", max_tokens=24, temperature=0)
    full = client.completions.create(**kw, extra_body={"ignore_eos": True}).choices[0].text
    stop = full[5:7]
    assert len(stop) == 2
    cut = full.index(stop)
    kept = client.completions.create(**kw, stop=[stop], extra_body={
        "ignore_eos": True, "include_stop_str_in_output": True}).choices[0]
    dropped = client.completions.create(**kw, stop=[stop],
                                        extra_body={"ignore_eos": True}).choices[0]
    assert kept.text == full[:cut + 2] and dropped.text == full[:cut]
    assert kept.finish_reason == dropped.finish_reason == "stop"


def test_truncate_prompt_tokens_and_add_special_tokens(client, gateway):
    prompt = "the quick brown fox jumps over the lazy dog " * 4
    full = post(gateway, "/tokenize", {"model": f"{MODEL}:4k", "prompt": prompt}).json()
    kw = dict(model=f"{MODEL}:4k", prompt=prompt, max_tokens=1)
    assert client.completions.create(**kw).usage.prompt_tokens == full["count"]
    cut = client.completions.create(**kw, extra_body={"truncate_prompt_tokens": 5})
    assert cut.usage.prompt_tokens == 5
    bare = client.completions.create(**kw, extra_body={"add_special_tokens": False})
    assert bare.usage.prompt_tokens == full["count"] - 1  # no BOS


def test_neutral_values_are_accepted(gateway):
    body = {"model": MODEL, "prompt": "hi", "max_tokens": 2, "repetition_penalty": 1.0,
            "presence_penalty": 0.0, "frequency_penalty": 0.0, "min_p": 0.0, "min_tokens": 0,
            "logit_bias": {}, "bad_words": [], "skip_special_tokens": True,
            "spaces_between_special_tokens": True, "ignore_eos": False}
    r = post(gateway, "/v1/completions", body)
    assert r.status_code == 200, r.text
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
            "repetition_penalty": 1.0, "add_generation_prompt": True, "echo": False,
            "add_special_tokens": False, "chat_template_kwargs": {}}
    assert post(gateway, "/v1/chat/completions", chat).status_code == 200


def _ids(gateway, head: str, text: str) -> list[int]:
    body = {"model": f"{MODEL}:{head}", "prompt": text, "add_special_tokens": False}
    return post(gateway, "/tokenize", body).json()["tokens"]


def _text(gateway, head: str, ids: list[int]) -> str:
    return post(gateway, "/detokenize", {"model": f"{MODEL}:{head}", "tokens": ids}).json()[
        "prompt"]


@pytest.mark.parametrize("field", ["logit_bias", "allowed_token_ids"])
def test_logit_bias_and_allowed_ids_force_a_token(gateway, field):
    (tid,) = _ids(gateway, "4k", " the")[-1:]
    value = {str(tid): 100} if field == "logit_bias" else [tid]
    body = {"model": f"{MODEL}:4k", "prompt": "a b", "max_tokens": 5, "temperature": 1.0,
            "seed": 3, "ignore_eos": True, field: value}
    r = post(gateway, "/v1/completions", body)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"] == _text(gateway, "4k", [tid] * 5)


def test_bad_words_and_penalties_change_the_greedy_text(gateway):
    body = {"model": f"{MODEL}:8k", "prompt": "once upon a time", "max_tokens": 12,
            "temperature": 0, "ignore_eos": True}
    plain = post(gateway, "/v1/completions", body).json()["choices"][0]["text"]
    word = plain.split()[0]
    banned = post(gateway, "/v1/completions", {**body, "bad_words": [word]}).json()
    assert word not in banned["choices"][0]["text"].split()
    for field, value in (("repetition_penalty", 3.0), ("frequency_penalty", 2.0),
                         ("presence_penalty", 2.0), ("min_p", 0.5)):
        r = post(gateway, "/v1/completions", {**body, field: value})
        assert r.status_code == 200, (field, r.text)


def test_min_tokens_holds_back_stop_ids_and_stop_strings(gateway):
    body = {"model": f"{MODEL}:1k", "prompt": "x", "max_tokens": 24, "temperature": 0,
            "ignore_eos": True}
    full = post(gateway, "/v1/completions", body).json()["choices"][0]
    ids = _ids(gateway, "1k", full["text"])
    stop = {**body, "stop_token_ids": [ids[1]], "ignore_eos": False}
    early = post(gateway, "/v1/completions", stop).json()
    assert early["usage"]["completion_tokens"] <= 2
    late = post(gateway, "/v1/completions", {**stop, "min_tokens": 6}).json()
    assert late["usage"]["completion_tokens"] >= 6, late


@pytest.mark.parametrize("field,value,param", [
    ("logit_bias", {"x": 1}, "logit_bias"), ("logit_bias", {"-3": 1}, "logit_bias"),
    ("allowed_token_ids", [], "allowed_token_ids"), ("bad_words", [" "], "bad_words"),
    ("min_tokens", 9, "min_tokens")])
def test_malformed_rules_are_400_naming_the_field(gateway, field, value, param):
    r = post(gateway, "/v1/completions",
             {"model": MODEL, "prompt": "hi", "max_tokens": 2, field: value})
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


def test_ids_in_rules_are_checked_against_the_head(gateway):
    for field, value in (("logit_bias", {"5000": 1.0}), ("allowed_token_ids", [5000])):
        body = {"model": f"{MODEL}:1k", "prompt": "a", "max_tokens": 2, field: value}
        r = post(gateway, "/v1/completions", body)
        assert r.status_code == 400 and r.json()["error"]["param"] == field, r.text
        routed = post(gateway, "/v1/completions", {**body, "model": MODEL})
        assert routed.status_code == 200 and routed.headers["x-polyhead-head"] == "8k"
        huge = post(gateway, "/v1/completions", {**body, "model": MODEL,
                                                 field: {"99999999": 1.0} if field ==
                                                 "logit_bias" else [99999999]})
        assert huge.status_code == 400 and huge.json()["error"]["param"] == field, huge.text


def test_chat_continue_final_message_and_echo(gateway):
    msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Once upon"}]
    body = {"model": f"{MODEL}:8k", "messages": msgs, "max_tokens": 4, "temperature": 0,
            "add_generation_prompt": False, "continue_final_message": True}
    plain = post(gateway, "/v1/chat/completions", body)
    assert plain.status_code == 200, plain.text
    echoed = post(gateway, "/v1/chat/completions", {**body, "echo": True})
    text = plain.json()["choices"][0]["message"]["content"]
    assert echoed.json()["choices"][0]["message"]["content"] == "Once upon" + text
    bad = post(gateway, "/v1/chat/completions", {**body, "add_generation_prompt": True})
    assert bad.status_code == 400
    bad = post(gateway, "/v1/chat/completions",
               {**body, "chat_template_kwargs": {"messages": []}})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "chat_template_kwargs"


@pytest.mark.parametrize("head", list(VOCAB))
def test_head_prefix_pins_every_route(gateway, head):
    base = f"/heads/{head}"
    r = post(gateway, f"{base}/v1/completions", {"model": MODEL, "prompt": "hi", "max_tokens": 2})
    assert r.status_code == 200 and r.headers["x-polyhead-head"] == head, r.text
    r = post(gateway, f"{base}/v1/chat/completions",
             {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
    assert r.status_code == 200 and r.headers["x-polyhead-head"] == head, r.text
    tok = post(gateway, f"{base}/tokenize", {"prompt": "hello world"}).json()
    pinned = post(gateway, "/tokenize", {"model": f"{MODEL}:{head}", "prompt": "hello world"})
    assert tok["tokens"] == pinned.json()["tokens"] and tok["head"] == head
    text = post(gateway, f"{base}/detokenize", {"tokens": tok["tokens"]}).json()["prompt"]
    assert text.endswith("hello world")
    info = httpx.get(f"{gateway.url}{base}/tokenizer_info").json()
    assert info["head"] == head and info["tokenizer_class"]


def test_head_prefix_errors(gateway):
    r = post(gateway, "/heads/nope/v1/completions", {"model": MODEL, "prompt": "hi"})
    assert r.status_code == 404 and r.json()["error"]["message"]
    r = post(gateway, "/heads/1k/v1/completions", {"model": f"{MODEL}:8k", "prompt": "hi"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "model"


def test_tokenizer_info_defaults_to_the_native_head(gateway):
    info = httpx.get(f"{gateway.url}/tokenizer_info").json()
    assert info["head"] == "8k" and info["model_max_length"] > 0
    pinned = httpx.get(f"{gateway.url}/tokenizer_info", params={"model": f"{MODEL}:1k"})
    assert pinned.json()["head"] == "1k"
