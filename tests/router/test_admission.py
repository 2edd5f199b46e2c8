from __future__ import annotations

import math

import pytest

from router.admission import Admission, KVBudget, OutputRatio
from router.profiles import HeadProfile

# Gemma-3-270M: 18 layers, 1 KV head of 256 dims, bf16 -> 2·18·256·2 = 18 KiB per token.
GEMMA_KV = 2 * 18 * 256 * 2
GEMMA_HEADS = [HeadProfile(n, v, 640, 100_000_000, GEMMA_KV, bytes_per_token=b)
               for n, v, b in (("32k", 32768, 3.9), ("131k", 131072, 4.4), ("262k", 262144, 4.6))]
PROMPT_BYTES, MAX_TOKENS, OUTPUT_BYTES = 4000, 1024, 2400


def _learned(budget: KVBudget, clock=lambda: 0.0) -> Admission:
    adm = Admission(GEMMA_HEADS, budget, OutputRatio(quantile=0.9), clock=clock)
    for h in GEMMA_HEADS:  # finished requests: the same ~2.4 KB answers, on every head
        for _ in range(20):
            adm.ratio.observe(round(OUTPUT_BYTES / h.bpt), MAX_TOKENS, h.bpt)
    return adm


def test_prior_until_enough_samples_then_learned_in_bytes() -> None:
    ratio = OutputRatio(quantile=0.5, prior_ratio=1.0, min_samples=4)
    assert ratio.expected_tokens(100, 4.0) == 100
    for out in (10, 20, 30, 40, 50):
        ratio.observe(out, 100, 4.0)
    assert ratio.bytes_per_max_token() == pytest.approx(1.2)  # median 30/100 × 4 B/token
    assert ratio.expected_tokens(100, 4.0) == pytest.approx(30)
    assert ratio.expected_tokens(100, 2.0) == pytest.approx(60)  # worse compression
    assert ratio.expected_tokens(10, 0.5) == 10  # never above max_tokens


def test_262k_head_admits_proportionally_more_than_32k_for_the_same_budget() -> None:
    budget = KVBudget(total_blocks=(8 << 30) // (16 * GEMMA_KV), block_size=16)  # 8 GiB
    admitted = {}
    for h in GEMMA_HEADS:
        adm = _learned(budget)
        prompt_tokens = math.ceil(PROMPT_BYTES / h.bpt)
        need = adm.footprint_blocks(h.name, prompt_tokens, MAX_TOKENS)
        n = 0
        while adm.try_admit(h.name, need) is not None:
            n += 1
        admitted[h.name] = n
        adm.observe_request(PROMPT_BYTES, MAX_TOKENS)
        assert adm.max_batch(h.name) == n  # the exported figure says the same
    ratio = admitted["262k"] / admitted["32k"]
    assert admitted == {"32k": 282, "131k": 320, "262k": 334}
    assert ratio == pytest.approx(4.6 / 3.9, rel=0.02)  # proportional to compression


def test_reservations_live_usage_and_release() -> None:
    adm = Admission(GEMMA_HEADS[:1], KVBudget(10, 16))
    a = adm.try_admit("32k", 6)
    assert a is not None and adm.try_admit("32k", 5) is None
    assert adm.try_admit("32k", 4) is not None
    adm.release(a)
    adm.release(a)  # twice is harmless
    assert adm.reserved_blocks == 4
    assert adm.try_admit("32k", 5, used_blocks=9) is None  # the engine holds more than planned
    lone = Admission(GEMMA_HEADS[:1], KVBudget(10, 16))
    assert lone.try_admit("32k", 50) is not None  # alone, anything the engine accepts


def test_retry_after_follows_the_drain_rate() -> None:
    now = [0.0]
    adm = Admission(GEMMA_HEADS[:1], KVBudget(100, 16), clock=lambda: now[0])
    tickets = [adm.try_admit("32k", 10) for _ in range(10)]
    assert adm.retry_after_s(10, fallback_s=7) == 7  # nothing drained yet
    for i, t in enumerate(tickets[:5]):
        now[0] = float(i + 1)
        assert t is not None
        adm.release(t)
    assert adm.drain_rate() == pytest.approx(50 / 4)
    for _ in range(5):
        adm.try_admit("32k", 10)
    assert adm.retry_after_s(40) == math.ceil(40 / 12.5)
