"""The load-level verdicts of `bench replay --levels`: dominance with the run's noise as ties,
and the issue's cost targets against the cheapest head within 5% of the largest's BPB."""

from __future__ import annotations

import math

from server.bench.replay.levels import Noise, Point, dominators, targets

NAN = math.nan


def pt(label: str, cost: float, en: float, non: float = NAN, inflight: float = NAN) -> Point:
    return Point(label, cost, inflight, en, non, 1.0, 2.0, {})


QUIET = Noise(0.0, 0.0, 2)
NOISY = Noise(0.05, 0.02, 2)


def test_a_static_head_cheaper_and_better_dominates() -> None:
    router = pt("lifecycle", 100, 0.90, 1.20)
    statics = [pt("static:131k", 95, 0.89, 1.19), pt("static:262k", 120, 0.88, 1.10),
               pt("static:32k", 80, 1.00, 2.00)]
    assert dominators(router, statics, QUIET) == ["static:131k"]
    # Cheaper but worse on one column: not dominating.
    assert dominators(router, [pt("static:131k", 95, 0.89, 1.30)], QUIET) == []


def test_differences_within_the_noise_are_ties_that_count_against_the_router() -> None:
    router = pt("lifecycle", 100, 0.90, 1.20)
    close = pt("static:131k", 104, 0.91, 1.21)  # 4% dearer, 1% worse: inside the noise
    assert dominators(router, [close], QUIET) == []
    assert dominators(router, [close], NOISY) == ["static:131k"]
    far = pt("static:131k", 106, 0.89, 1.19)  # 6% dearer: outside
    assert dominators(router, [far], NOISY) == []


def test_english_only_trace_ignores_the_missing_column() -> None:
    router = pt("lifecycle", 100, 0.90)
    assert dominators(router, [pt("static:131k", 99, 0.90)], QUIET) == ["static:131k"]
    assert dominators(router, [pt("static:131k", 101, 0.90)], QUIET) == []


def test_cost_targets_use_the_cheapest_head_inside_the_bpb_bound() -> None:
    pts = [pt("lifecycle", 90, 0.90, 1.18), pt("static:32k", 60, 1.00, 2.0),
           pt("static:131k", 100, 0.90, 1.17), pt("static:262k", 120, 0.88, 1.15)]
    low = targets(pts, "lifecycle", "static:262k", "B=1", QUIET, False, True, False)
    assert [m for _, m, _ in low] == [True, True]  # 90 <= 0.95 x 100 (32k is out of bound)
    assert "static:131k" in low[1][0]
    high = targets(pts, "lifecycle", "static:262k", "B=16", QUIET, False, False, True)
    assert [m for _, m, _ in high] == [True, True]  # 90 <= 120
    outside = [pt("lifecycle", 50, 0.99, 1.5), *pts[1:]]
    checks = targets(outside, "lifecycle", "static:262k", "B=1", QUIET, False, True, True)
    assert [m for _, m, _ in checks] == [True, False, False]  # cheap, but its BPB is out
    english = targets([pt("lifecycle", 101, 0.9), pt("static:262k", 100, 0.89)], "lifecycle",
                      "static:262k", "B=4", QUIET, True, False, False)
    assert [m for _, m, _ in english] == [False, False]


def test_stock_vllm_is_judged_on_in_flight_time_at_low_load_only() -> None:
    pts = [pt("lifecycle", 90, 0.90, 1.18, inflight=100),
           pt("static:131k", 100, 0.90, 1.17, inflight=110),
           pt("static:262k", 120, 0.88, 1.15, inflight=130),
           pt("stock-vllm:262k", NAN, 0.88, 1.15, inflight=125)]
    low = targets(pts, "lifecycle", "static:262k", "B=1", QUIET, False, True, False)
    stock = [(m, d) for name, m, d in low if "stock-vllm:262k" in name]
    assert stock == [(True, "100 vs 125 s/MB in flight (0.800x); router BPB inside the 5%")]
    pts[-1] = pt("stock-vllm:262k", NAN, 0.88, 1.15, inflight=110)  # 100/110 = 0.91 > 0.85
    low = targets(pts, "lifecycle", "static:262k", "B=1", QUIET, False, True, False)
    assert [m for name, m, _ in low if "stock-vllm" in name] == [False]
    # Not a static head: it never dominates, and only the low level compares with it.
    assert "dominated" not in low[0][2]
    high = targets(pts, "lifecycle", "static:262k", "B=16", QUIET, False, False, True)
    assert not [name for name, _, _ in high if "stock-vllm" in name]
