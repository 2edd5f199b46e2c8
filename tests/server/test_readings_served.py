"""A gateway at its defaults serves every split head's two-level reading as a head, and a
request the router sends to a reading carries its ladder to the engine: the decision record
names it, and /metrics shows what the engine measured and where it moved the request."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from tests.conftest import ADMIN_TOKEN, Gateway, start_gateway, stop_gateway

pytestmark = pytest.mark.integration
AUTH = {"authorization": f"Bearer {ADMIN_TOKEN}"}
READINGS = ["1k+groups", "4k+groups"]
NATIVE = "8k"


@pytest.fixture(scope="module")
def served(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[Gateway]:
    logs = tmp_path_factory.mktemp("readings")
    gw = start_gateway(tiny_model_dir, logs / "gateway.log", POLYHEAD_ADMIN_TOKEN=ADMIN_TOKEN,
                       POLYHEAD_CACHE_DIR=str(logs / "cache"))
    yield gw
    stop_gateway(gw)


def test_the_default_gateway_serves_every_reading_as_a_head(served: Gateway) -> None:
    heads = httpx.get(f"{served.url}/admin/heads", headers=AUTH, timeout=10).json()["heads"]
    assert [h["name"] for h in heads] == ["1k", "4k", "8k", *READINGS]
    models = {m["id"] for m in httpx.get(f"{served.url}/v1/models", timeout=10).json()["data"]}
    assert {f"tiny:{r}" for r in READINGS} <= models


def test_a_request_routed_to_a_reading_carries_its_ladder(served: Gateway) -> None:
    client = openai.OpenAI(base_url=f"{served.url}/v1", api_key="none")
    # Before any step is measured the analytic cost puts the smallest reading first, so the
    # first request lands there with a ladder; a request pinned to a head never has one.
    for i in range(4):
        out = client.completions.create(model="tiny", prompt=f"the quick brown fox {i} " * 8,
                                        max_tokens=12, temperature=0)
        assert out.choices[0].text is not None
    pinned = client.completions.create(model=f"tiny:{READINGS[0]}", prompt="hello " * 20,
                                       max_tokens=4, temperature=0)
    assert pinned.choices[0].finish_reason in ("stop", "length")
    decisions = httpx.get(f"{served.url}/admin/decisions?limit=5", headers=AUTH,
                          timeout=10).json()["decisions"]
    for d in decisions:
        if d["policy"] == "request_pin" or d["head"] not in READINGS:
            assert d["ladder"] == []
        else:
            assert d["ladder"][0] == d["head"] and d["ladder"][-1] == NATIVE
    laddered = [d for d in decisions if d["ladder"]]
    assert laddered, [(d["head"], d["reason"]) for d in decisions]
    metrics = httpx.get(f"{served.url}/metrics", timeout=10).text
    for rung in laddered[0]["ladder"][:-1]:  # the prompt was measured on every reading
        assert f'polyhead_measured_prompt_loss_count{{head="{rung}"}}' in metrics
    assert "# TYPE polyhead_head_moves_total counter" in metrics
    # A request moved up at its prefill generated every token on the head it moved to, and
    # that is where its generated tokens count.
    moved = re.findall(r'polyhead_head_moves_total\{from_head="([^"]+)",source="prompt",'
                       r'to_head="([^"]+)"\} ([0-9.]+)', metrics)
    assert moved  # the tiny readings lose more than 5% on these prompts
    for _, to_head, _ in moved:
        line = f'polyhead_tokens_total{{direction="generated",head="{to_head}"}} '
        assert line in metrics and not metrics.split(line)[1].startswith("0"), to_head
