"""cost, threshold and weighted policies; decision records; live-B smoothing."""

from __future__ import annotations

import pytest

from kernels.devices import DEVICES
from router.errors import InvalidPolicy
from router.policy.builtin import CostPolicy, ThresholdPolicy, WeightedPolicy
from router.policy.spec import CostParams, ThresholdParams, WeightedParams, parse_policy
from router.profiles import RequestFeatures
from router.router import Router
from router.stability import REASON_CODES
from router.state import LiveState
from tests.router.helpers import heads

HEADS = ["32k", "131k", "262k"]
FEATS = RequestFeatures(prompt_bytes=8000, max_tokens=256)


@pytest.mark.parametrize(
    ("doc", "field"),
    [
        ({"name": "threshold", "params": {"batch_high": -1}}, "params.batch_high"),
        ({"name": "threshold", "params": {"large": "9k"}}, "params.large"),
        ({"name": "cost", "params": {"lambda_override": 1}}, "params.lambda_override"),
        ({"name": "cost", "params": {"max_switches_per_min": 1.5}}, "params.max_switches_per_min"),
        ({"name": "cost", "params": {"spill": 1}}, "params.spill"),
        ({"name": "weighted"}, "params.weights"),
        ({"name": "weighted", "params": {"weights": {"32k": 0}}}, "params.weights"),
        ({"name": "weighted", "params": {"weights": {"1k": 1}}}, "params.weights.1k"),
    ],
)
def test_new_policies_validate(doc: dict, field: str) -> None:
    with pytest.raises(InvalidPolicy) as err:
        parse_policy(doc, HEADS)
    assert err.value.field == field


def test_round_trip_of_every_policy() -> None:
    for doc in ({"name": "cost", "params": {"margin": 0.1, "spill": True}},
                {"name": "threshold", "params": {"batch_high": 32, "large": "131k"}},
                {"name": "weighted", "params": {"weights": {"32k": 3, "262k": 1}}}):
        spec = parse_policy(doc, HEADS)
        assert parse_policy(spec.to_doc(), HEADS) == spec


def _state(batch: int, lam: float) -> LiveState:
    state = LiveState.for_profiles(heads())
    state.set_load("32k", batch - 1, 0)
    state.add_served("32k", int(lam * 1e12), 1)
    return state


def test_threshold_rule_and_its_hysteresis_band() -> None:
    t = [0.0]
    policy = ThresholdPolicy(ThresholdParams(min_dwell_s=0), clock=lambda: t[0])
    assert policy.decide(FEATS, _state(1, 0).snapshot(), heads()).head == "32k"
    assert policy.decide(FEATS, _state(30, 0).snapshot(), heads()).head == "131k"
    c = policy.decide(FEATS, _state(200, 20).snapshot(), heads())
    assert c.head == "262k" and "by rule" in c.reason
    c = policy.decide(FEATS, _state(63, 20).snapshot(), heads())  # B=63 within 5% of 64
    assert c.head == "262k" and c.code == "hysteresis"
    assert policy.decide(FEATS, _state(60, 20).snapshot(), heads()).head == "131k"
    custom = ThresholdPolicy(ThresholdParams(batch_high=8, lambda_high=0.5, large="131k"))
    assert custom.decide(FEATS, _state(20, 1).snapshot(), heads()).head == "131k"


def test_cost_policy_ignores_lambda() -> None:
    policy = CostPolicy(DEVICES["h100-sxm"], CostParams(margin=0, min_dwell_s=0))
    for lam in (0.0, 100.0):
        c = policy.decide(FEATS, _state(256, lam).snapshot(), heads())
        assert c.head == "262k" and c.reason.startswith("cost: 262k cheapest at B=256")


def test_weighted_split_and_dwell_runs() -> None:
    t = [0.0]
    policy = WeightedPolicy(WeightedParams({"32k": 3, "262k": 1}), clock=lambda: t[0])
    snap = _state(1, 0).snapshot()
    picks = [policy.decide(FEATS, snap, heads()).head for _ in range(400)]
    assert picks.count("32k") == 300 and picks.count("262k") == 100
    runs = WeightedPolicy(WeightedParams({"32k": 1, "262k": 1}, min_dwell_s=10),
                          clock=lambda: t[0])
    heads_seen = []
    for i in range(200):
        t[0] = i * 0.5  # a request every 0.5 s, 100 s in all
        heads_seen.append(runs.decide(FEATS, snap, heads()).head)
    switches = sum(a != b for a, b in zip(heads_seen, heads_seen[1:], strict=False))
    assert switches <= 10 and abs(heads_seen.count("32k") - 100) <= 20


def test_router_keeps_bounded_decision_records() -> None:
    profiles = heads()
    state = LiveState.for_profiles(profiles)
    router = Router(profiles, DEVICES["a100-80"], state, {"name": "lifecycle"}, decision_log=5)
    for i in range(8):
        router.decide(RequestFeatures(100 + i, 16))
    pinned = router.decide(RequestFeatures(1, 1, pinned_head="262k"))
    assert pinned.code == "request_pin"
    records = [d.to_record() for d in router.decisions.last(100)]
    assert len(records) == 5 and router.decisions.total == 9
    assert records[0]["head"] == "262k"  # newest first
    last = records[1]
    assert last["policy"] == "lifecycle" and last["version"] == 1
    assert set(last["inputs"]) >= {"batch", "batch_raw", "batch_smoothed", "lambda", "queue"}
    assert set(last["costs"]) == set(HEADS) and last["code"] in REASON_CODES
    moved = router.spill(router.decisions.last(1)[0], "131k", "262k is full")
    assert moved.code == "spill" and moved.head == "131k"


def test_live_batch_is_smoothed_over_the_window() -> None:
    state = LiveState({"a": 1.0, "b": 1.0}, window_s=10.0)
    state.set_loads({"a": (0, 0), "b": (0, 0)}, now=0.0)
    state.set_loads({"a": (100, 0), "b": (0, 0)}, now=1.0)  # a 1 s spike
    snap = state.snapshot()
    assert snap.batch == 100 and 9 < snap.smoothed_batch < 10  # 100·(1 - e^-0.1)
    state.set_loads({"a": (100, 0)}, now=100.0)
    assert state.snapshot().smoothed_batch == pytest.approx(100, rel=1e-3)
    raw = LiveState({"a": 1.0}, window_s=0)
    raw.set_load("a", 7, 0)
    assert raw.snapshot().smoothed_batch == 7
