"""Exact drafting through the real gateway: with the policy's max_bpb_loss at 0 the native
head writes every token while a reading drafts, so greedy and seeded completions equal the
pinned native head's, logprobs are served, and the decision log and /metrics show the
drafter, k and acceptance."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from tests.conftest import ADMIN_TOKEN, Gateway, start_gateway, stop_gateway

pytestmark = pytest.mark.integration
AUTH = {"authorization": f"Bearer {ADMIN_TOKEN}"}
NATIVE, READING = "8k", "1k+groups"
PROMPTS = ["hello world", "the quick brown fox", "zwei drei vier", "def f(x):"]


@pytest.fixture(scope="module")
def gw(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    # A fixed k: on the tiny model every head's step costs the same, so the priced k is 0.
    g = start_gateway(tiny_model_dir, tmp_path_factory.mktemp("exact") / "gw.log",
                      POLYHEAD_GROUPED_HEADS='["1k"]', POLYHEAD_ADMIN_TOKEN=ADMIN_TOKEN,
                      POLYHEAD_NUM_DRAFT_TOKENS="3")
    yield g
    stop_gateway(g)


def _completions(client: openai.OpenAI, model: str, **kw: object) -> list[tuple[str, list]]:
    out = []
    for p in PROMPTS:
        r = client.completions.create(model=model, prompt=p, max_tokens=24, **kw)  # type: ignore[call-overload]
        lps = r.choices[0].logprobs.token_logprobs if r.choices[0].logprobs else []
        out.append((r.choices[0].text, lps))
    return out


def test_a_zero_bound_serves_the_native_heads_output_with_a_drafter(gw: Gateway) -> None:
    client = openai.OpenAI(base_url=f"{gw.url}/v1", api_key="x", max_retries=0)
    before = httpx.get(f"{gw.url}/admin/policy", headers=AUTH, timeout=10).json()
    kinds: list[dict[str, object]] = [{"temperature": 0}, {"temperature": 0.9, "seed": 7},
                                      {"temperature": 0.7, "top_p": 0.9, "seed": 3}]
    native = [_completions(client, f"tiny:{NATIVE}", logprobs=0, **kw) for kw in kinds]
    try:
        r = httpx.put(f"{gw.url}/admin/policy", headers=AUTH, timeout=10,
                      json={"name": "lifecycle", "params": {"max_bpb_loss": 0}})
        assert r.status_code == 200, r.text
        exact = [_completions(client, "tiny", logprobs=0, **kw) for kw in kinds]
        plain = httpx.post(f"{gw.url}/v1/completions", timeout=30,
                           json={"model": "tiny", "prompt": "hello", "max_tokens": 3})
        assert plain.headers["x-polyhead-head"] == NATIVE
        tops = httpx.post(f"{gw.url}/v1/completions", timeout=30, json={
            "model": "tiny", "prompt": "hello", "max_tokens": 3, "logprobs": 2})
        assert tops.status_code == 200  # runs natively: alternatives need every row
        streamed = client.completions.create(model="tiny", prompt=PROMPTS[0], max_tokens=24,
                                             temperature=0, stream=True)
        assert "".join(c.choices[0].text for c in streamed) == native[0][0][0]
        decisions = httpx.get(f"{gw.url}/admin/decisions", headers=AUTH, timeout=10).json()
    finally:
        httpx.put(f"{gw.url}/admin/policy", headers=AUTH, timeout=10,
                  json={"name": before["name"], "params": before["params"]})
    for got, want in zip(exact, native, strict=True):
        assert [t for t, _ in got] == [t for t, _ in want]
        for (_, a), (_, b) in zip(got, want, strict=True):
            assert a == pytest.approx(b, abs=1e-3)  # the verifying native logits
    last = decisions["decisions"][0]
    assert last["head"] == NATIVE and last["drafter"] == READING and last["code"] == "exact"
    drafting = decisions["drafting"]
    assert drafting["k"] == 3 and drafting["drafters"][READING]["verifies"] > 0, drafting
    assert "break_even_batch" in drafting["drafters"][READING]  # None: k is fixed at 3
    metrics = httpx.get(f"{gw.url}/metrics", timeout=10).text
    assert f'polyhead_drafts_accepted_total{{drafter="{READING}"}}' in metrics
    assert "polyhead_draft_k 3.0" in metrics
    assert 'polyhead_quality_guard_seconds_total{phase="probe"}' in metrics
