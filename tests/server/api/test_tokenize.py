"""POST /tokenize and /detokenize (vLLM's shapes) through a real uvicorn process."""

from __future__ import annotations

import httpx
import openai
import pytest

pytestmark = pytest.mark.integration

MODEL = "tiny"
HEADS = ("1k", "4k", "8k")
TEXT = "the quick brown fox jumps"


def post(gateway, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{gateway.url}{path}", json=body, timeout=30)


@pytest.fixture
def client(gateway) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="unused", max_retries=0)


@pytest.mark.parametrize("head", HEADS)
def test_tokenize_counts_what_completions_charges(gateway, client, head):
    r = post(gateway, "/tokenize", {"model": f"{MODEL}:{head}", "prompt": TEXT})
    assert r.status_code == 200, r.text
    body = r.json()
    assert set(body) == {"count", "max_model_len", "tokens", "token_strs", "head"}
    assert body["head"] == head == r.headers["x-polyhead-head"]
    assert body["count"] == len(body["tokens"])
    assert body["max_model_len"] > 0
    usage = client.completions.create(model=f"{MODEL}:{head}", prompt=TEXT, max_tokens=1).usage
    assert usage.prompt_tokens == body["count"]


def test_heads_tokenize_differently(gateway):
    counts = {h: post(gateway, "/tokenize", {"model": f"{MODEL}:{h}", "prompt": TEXT * 4}
                      ).json()["count"] for h in HEADS}
    assert counts["1k"] > counts["8k"]  # the larger vocabulary needs fewer tokens


def test_tokenize_chat_matches_chat_usage(gateway, client):
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": TEXT}]
    body = post(gateway, "/tokenize", {"model": f"{MODEL}:4k", "messages": messages}).json()
    usage = client.chat.completions.create(model=f"{MODEL}:4k", messages=messages,
                                           max_tokens=1).usage
    assert usage.prompt_tokens == body["count"]


def test_routed_tokenize_names_the_routers_head(gateway):
    r = post(gateway, "/tokenize", {"model": MODEL, "prompt": TEXT, "return_token_strs": True})
    body = r.json()
    assert body["head"] in HEADS and r.headers["x-polyhead-head"] == body["head"]
    assert len(body["token_strs"]) == body["count"]
    pinned = post(gateway, "/tokenize", {"model": f"{MODEL}:{body['head']}", "prompt": TEXT})
    assert pinned.json()["tokens"] == body["tokens"]


def test_add_special_tokens_false_drops_bos(gateway):
    on = post(gateway, "/tokenize", {"model": f"{MODEL}:1k", "prompt": TEXT}).json()
    off = post(gateway, "/tokenize", {"model": f"{MODEL}:1k", "prompt": TEXT,
                                      "add_special_tokens": False}).json()
    assert on["tokens"][1:] == off["tokens"]


def test_detokenize_round_trips(gateway):
    for head in HEADS:
        ids = post(gateway, "/tokenize", {"model": f"{MODEL}:{head}", "prompt": TEXT,
                                          "add_special_tokens": False}).json()["tokens"]
        r = post(gateway, "/detokenize", {"model": f"{MODEL}:{head}", "tokens": ids})
        assert r.status_code == 200, r.text
        assert r.json() == {"prompt": TEXT, "head": head}


def test_detokenize_errors(gateway):
    r = post(gateway, "/detokenize", {"model": MODEL, "tokens": [1, 2]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "model"
    r = post(gateway, "/detokenize", {"model": f"{MODEL}:1k", "tokens": [1024]})
    assert r.status_code == 400 and "[0, 1024)" in r.json()["error"]["message"]
    r = post(gateway, "/tokenize", {"model": MODEL, "prompt": "x", "messages": []})
    assert r.status_code == 400
    r = post(gateway, "/tokenize", {"model": "gpt-4", "prompt": "x"})
    assert r.status_code == 404


def test_long_prompt_tokenized_off_the_loop_matches_the_tokenizer(gateway, tiny_model_dir):
    """A prompt past the planner's offload size is tokenized in a worker thread; the ids are
    the head tokenizer's own, BOS first, on every head the request-aware policy priced."""
    from heads.checkpoint import load_metadata
    from server.gateway.request_planner import OFFLOAD_CHARS

    text = ("Mixed prose, numbers 1887 and Привет мир. " * 200)[: OFFLOAD_CHARS * 2]
    manifest, tokenizers = load_metadata(tiny_model_dir)
    r = post(gateway, "/tokenize", {"model": MODEL, "prompt": text})
    assert r.status_code == 200, r.text
    head = r.json()["head"]
    spec = manifest.head(head)
    want = tokenizers[head].encode(text)
    if spec.bos_token_id is not None:
        want = [spec.bos_token_id, *want]
    assert r.json()["tokens"] == want
