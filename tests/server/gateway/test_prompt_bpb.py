"""Live prompt BPB at the gateway: request sampling, the metrics, /admin/heads (tiny model)."""

from __future__ import annotations

import random

import httpx
import pytest

from server.gateway.prompt_bpb import PromptBpbConfig
from tests.conftest import ADMIN_TOKEN, Gateway
from tests.server.metrics_util import scrape

AUTH = {"authorization": f"Bearer {ADMIN_TOKEN}"}


def test_modes_fraction_and_opt_out():
    rng = random.Random(0)
    assert PromptBpbConfig("on").request(None, rng) == (True, 0)  # 0: every position
    assert PromptBpbConfig("off").request(True, rng) == (False, 0)
    assert PromptBpbConfig("on").request(False, rng) == (False, 0)
    sampled = PromptBpbConfig("sampled", positions=16, fraction=0.25)
    picks = [sampled.request(None, rng) for _ in range(4000)]
    assert {k for _, k in picks} == {16}
    assert sum(s for s, _ in picks) / len(picks) == pytest.approx(0.25, abs=0.03)
    with pytest.raises(ValueError):
        PromptBpbConfig(fraction=1.5)


def _count(gw: Gateway, head: str) -> float:
    return scrape(gw.url).get(("polyhead_prompt_bpb_count", (("head", head),)), 0.0)


@pytest.mark.integration
def test_scored_prompts_reach_the_histogram_and_admin_heads(gateway: Gateway):
    body = {"model": "tiny:1k", "prompt": "hello there, general kenobi", "max_tokens": 2}
    before = after = _count(gateway, "1k")
    for _ in range(60):  # the default mode scores a random share of requests
        assert httpx.post(f"{gateway.url}/v1/completions", json=body, timeout=60).is_success
        after = _count(gateway, "1k")
        if after > before:
            break
    assert after == before + 1
    skipped = {**body, "prompt_bpb": False}
    assert httpx.post(f"{gateway.url}/v1/completions", json=skipped, timeout=60).is_success
    assert _count(gateway, "1k") == after
    heads = {h["name"]: h for h in
             httpx.get(f"{gateway.url}/admin/heads", headers=AUTH).json()["heads"]}
    h = heads["1k"]
    assert h["bpb_samples"] >= 1 and h["live_bpb"] > 0 and h["guard"] is None
    assert h["drift_flag"] is False  # no manifest BPB on the tiny model: nothing to drift from
    m = scrape(gateway.url)
    assert m[("polyhead_prompt_bpb_smoothed", (("head", "1k"),))] == pytest.approx(h["live_bpb"])
    assert m[("polyhead_guard_excluded", (("head", "1k"),))] == 0
    bad = {**body, "prompt_bpb": "yes please"}
    assert httpx.post(f"{gateway.url}/v1/completions", json=bad, timeout=60).status_code == 400
