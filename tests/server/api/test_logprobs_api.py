"""Logprobs an evaluator reads, through a real uvicorn process on the tiny model: top-N
alternatives (completions `logprobs: N`, chat `top_logprobs`), `echo` with the prompt's own
logprobs (lm-eval's loglikelihood request), and vLLM's `prompt_logprobs`."""

from __future__ import annotations

import json
import math

import httpx
import openai
import pytest

pytestmark = pytest.mark.integration

MODEL = "tiny"
IDS = [17, 230, 41, 99, 5, 311, 12, 70]  # a token-id prompt, valid on every tiny head
# The sampled token's logprob (the kernels' fp32 logit minus a log-sum-exp over the packed
# rows' logits) and the alternatives (a log-softmax of one more product) are two paths. In
# bf16, the default where the CPU has a bf16 GEMM, each logit is rounded to 8 significant
# bits: within 2^-8 of itself, and the tiny model's logits stay below 1 in magnitude, so the
# two paths agree within 2 x 2^-8. In fp32 they agree to 1e-5.
PATHS_ATOL = 2 * 2.0**-8


def post(gateway, path: str, body: dict) -> dict:
    r = httpx.post(f"{gateway.url}{path}", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


@pytest.fixture
def client(gateway) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="unused", max_retries=0)


def test_completion_top_n_alternatives(client):
    c = client.completions.create(model=f"{MODEL}:4k", prompt="a b c", max_tokens=6,
                                  temperature=0, logprobs=5, extra_body={"ignore_eos": True})
    lp = c.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 6
    for token, value, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs, strict=True):
        assert 1 <= len(top) <= 5
        assert value == pytest.approx(max(top.values()), abs=PATHS_ATOL)  # greedy: the top one
        assert top[token] == pytest.approx(value, abs=PATHS_ATOL)
        assert sum(math.exp(v) for v in top.values()) <= 1 + 1e-4


def test_echo_with_logprobs_is_what_lm_eval_reads(gateway):
    body = {"model": f"{MODEL}:8k", "prompt": IDS, "echo": True, "max_tokens": 1,
            "logprobs": 1, "temperature": 0}
    choice = post(gateway, "/v1/completions", body)["choices"][0]
    lp = choice["logprobs"]
    assert len(lp["tokens"]) == len(IDS) + 1  # the prompt, then the one generated token
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    detok = post(gateway, "/detokenize", {"model": f"{MODEL}:8k", "tokens": IDS})["prompt"]
    assert choice["text"].startswith(detok)
    ranked = post(gateway, "/v1/completions", {**body, "echo": False, "logprobs": None,
                                               "prompt_logprobs": 1})["choices"][0]
    plps = ranked["prompt_logprobs"]
    assert plps[0] is None and len(plps) == len(IDS)
    for p in range(1, len(IDS)):
        value, top = lp["token_logprobs"][p], lp["top_logprobs"][p]
        own = plps[p][str(IDS[p])]
        assert own["logprob"] == pytest.approx(value, abs=1e-5)
        # lm-eval's is_greedy: the prompt token is the top-1 exactly when its rank is 1
        assert (value == max(top.values())) == (own["rank"] == 1)
        assert max(top.values()) >= value


def test_prompt_logprobs_shape(gateway):
    body = {"model": f"{MODEL}:1k", "prompt": IDS, "max_tokens": 1, "prompt_logprobs": 3}
    plps = post(gateway, "/v1/completions", body)["choices"][0]["prompt_logprobs"]
    for p in range(1, len(IDS)):
        entry = plps[p]
        assert str(IDS[p]) in entry and 3 <= len(entry) <= 4
        ranks = sorted(v["rank"] for v in entry.values())
        assert ranks[:3] == [1, 2, 3]
        assert all(int(i) < 1024 for i in entry)  # a 1k head's distribution is over its rows


def test_chat_top_logprobs_through_the_sdk(client):
    c = client.chat.completions.create(model=f"{MODEL}:4k", max_tokens=4, temperature=0,
                                       messages=[{"role": "user", "content": "hi"}],
                                       logprobs=True, top_logprobs=3,
                                       extra_body={"ignore_eos": True})
    content = c.choices[0].logprobs.content
    assert len(content) == 4
    for tok in content:
        assert len(tok.top_logprobs) == 3
        assert tok.top_logprobs[0].logprob == pytest.approx(tok.logprob, abs=PATHS_ATOL)
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=MODEL, max_tokens=1, top_logprobs=2,
                                       messages=[{"role": "user", "content": "hi"}])


def test_streamed_echo_equals_the_whole_response(gateway):
    body = {"model": f"{MODEL}:8k", "prompt": IDS, "echo": True, "max_tokens": 3,
            "logprobs": 2, "temperature": 0, "ignore_eos": True}
    whole = post(gateway, "/v1/completions", body)["choices"][0]
    tokens, values, text = [], [], ""
    with httpx.stream("POST", f"{gateway.url}/v1/completions", json={**body, "stream": True},
                      timeout=60) as r:
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            ch = json.loads(line[6:])["choices"][0]
            text += ch["text"]
            if ch["logprobs"]:
                tokens += ch["logprobs"]["tokens"]
                values += ch["logprobs"]["token_logprobs"]
    assert text == whole["text"]
    assert tokens == whole["logprobs"]["tokens"]
    assert values == whole["logprobs"]["token_logprobs"]
