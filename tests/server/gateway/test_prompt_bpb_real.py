"""Live prompt BPB and the quality guard on the Gemma-3 demo, through a real server.

Prose, code and random-byte prompts go through each head; the per-request BPB comes from
the `polyhead_prompt_bpb` histogram's sum (requests are sequential). Then a guarded policy
moves traffic off the 32k head while random bytes arrive, and back once prose returns.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from heads.data.files import PROMPT_BPB_PROMPTS
from kernels.cache_paths import cache_root
from server.model_source import resolve_model_dir
from tests.conftest import ADMIN_TOKEN, Gateway, start_gateway, stop_gateway
from tests.server.metrics_util import scrape

pytestmark = [pytest.mark.model, pytest.mark.integration, pytest.mark.slow]
HEADS = ("32k", "131k", "262k")
AUTH = {"authorization": f"Bearer {ADMIN_TOKEN}"}
# The prompt BPB benchmark's prompts, by type.
TEXTS = json.loads(PROMPT_BPB_PROMPTS.read_text(encoding="utf-8"))
# Between prose/code (~0.6-1.3 bits/byte on this model) and random bytes (4+).
BOUND = 2.5


@pytest.fixture(scope="module")
def demo_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    demo = resolve_model_dir("gemma3-270m", cache_root(expand_user=True))
    gw = start_gateway(Path(demo), tmp_path_factory.mktemp("bpb") / "gw.log",
                       POLYHEAD_TORCH_THREADS="2", POLYHEAD_KV_CACHE_MB="64",
                       POLYHEAD_ADMIN_TOKEN=ADMIN_TOKEN, POLYHEAD_PROMPT_BPB_ALPHA="0.5",
                       # the trimmed heads' routing and guard, without the readings
                       POLYHEAD_GROUPED_HEADS="[]",
                       # every request scored (32 sampled positions): deterministic counts
                       POLYHEAD_PROMPT_BPB_FRACTION="1", POLYHEAD_PROMPT_BPB_MIN_SAMPLES="3",
                       POLYHEAD_CACHE_DIR=str(tmp_path_factory.mktemp("bpb-cache")))
    yield gw
    stop_gateway(gw)


def complete(gw: Gateway, model: str, prompt: str, **extra: object) -> tuple[str, float | None]:
    """-> (head that served it, its prompt BPB from the histogram; None if not scored)."""
    def total() -> tuple[float, float]:
        m = scrape(gw.url)
        return (sum(v for (n, _), v in m.items() if n == "polyhead_prompt_bpb_sum"),
                sum(v for (n, _), v in m.items() if n == "polyhead_prompt_bpb_count"))
    s0, n0 = total()
    r = httpx.post(f"{gw.url}/v1/completions", timeout=300, json={
        "model": model, "prompt": prompt, "max_tokens": 1, "temperature": 0, **extra})
    assert r.status_code == 200, r.text
    s1, n1 = total()
    return r.headers["x-polyhead-head"], (s1 - s0 if n1 > n0 else None)


def test_bpb_separates_prose_code_and_random_bytes(demo_gateway: Gateway):
    table = {}
    for head in HEADS:
        for kind, text in TEXTS.items():
            served, bpb = complete(demo_gateway, f"gemma3-270m:{head}", text)
            assert served == head and bpb is not None
            table[(head, kind)] = bpb
    print("live prompt BPB (head, prompt) ->", {k: round(v, 3) for k, v in table.items()})  # noqa: T201
    for head in HEADS:
        assert 0.3 < table[(head, "code")] < 2.0 and 0.3 < table[(head, "prose")] < 2.0
        assert table[(head, "random")] > max(BOUND + 1.5, 3 * table[(head, "prose")])
    _, skipped = complete(demo_gateway, "gemma3-270m:32k", TEXTS["prose"], prompt_bpb=False)
    assert skipped is None  # the per-request opt-out
    heads = httpx.get(f"{demo_gateway.url}/admin/heads", headers=AUTH).json()["heads"]
    for h in heads:  # random bytes sit in every head's smoothed value: drift is flagged
        assert h["bpb_samples"] == 3 and h["live_bpb"] > h["bpb"]
        assert h["drift_flag"] is True and h["guard"] is None


def test_guard_moves_traffic_off_a_head_and_back(demo_gateway: Gateway):
    # Only 32k is bounded: random bytes are hard for every head, so a uniform bound would
    # exclude them all and the guard would stand aside.
    # The per-request quality bound is off: this is the live guard's test, on its own.
    doc = {"name": "threshold", "params": {"min_dwell_s": 0, "max_switches_per_min": 0,
                                           "max_bpb_loss": None},
           "guard": {"bounds": {"32k": BOUND}, "margin": 0.1, "min_samples": 2,
                     "min_dwell_s": 0, "max_switches_per_min": 0}}
    r = httpx.put(f"{demo_gateway.url}/admin/policy", json=doc, headers=AUTH)
    assert r.status_code == 200 and r.json()["guard"]["bounds"] == {"32k": BOUND}, r.text
    served = [complete(demo_gateway, "gemma3-270m", TEXTS["prose"])[0] for _ in range(3)]
    assert served == ["32k"] * 3, served  # B=1: the threshold rule's small head
    # One random-byte prompt lifts 32k's smoothed BPB (alpha 0.5) over the bound.
    served = [complete(demo_gateway, "gemma3-270m", TEXTS["random"])[0] for _ in range(3)]
    assert served == ["32k", "131k", "131k"], served
    last = httpx.get(f"{demo_gateway.url}/admin/decisions?limit=1", headers=AUTH).json()
    assert "guard: excluded 32k (bpb" in last["decisions"][0]["reason"], last
    heads = {h["name"]: h for h in
             httpx.get(f"{demo_gateway.url}/admin/heads", headers=AUTH).json()["heads"]}
    assert heads["32k"]["guard"] == "excluded" and heads["131k"]["guard"] == "eligible"
    assert scrape(demo_gateway.url)[("polyhead_guard_excluded", (("head", "32k"),))] == 1
    # Prose again: once 32k's own figure is stale (2 samples × 3 heads), 131k's prose BPB
    # scaled by the manifest ratio stands in for it and readmits it.
    served = [complete(demo_gateway, "gemma3-270m", TEXTS["prose"])[0] for _ in range(8)]
    assert served[0] == "131k" and served[-1] == "32k", served
    records = httpx.get(f"{demo_gateway.url}/admin/decisions?limit=20", headers=AUTH).json()
    assert any("guard: readmitted 32k" in d["reason"] for d in records["decisions"])
    print("guard switching:", [(d["head"], d["reason"].split("guard: ")[-1])  # noqa: T201
                               for d in reversed(records["decisions"])])
