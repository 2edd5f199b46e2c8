"""Quality guard: exclusion over the bound, hysteresis, dwell, recovery, records, parsing."""

from __future__ import annotations

import dataclasses

import pytest

from kernels.devices import DEVICES
from router.errors import InvalidPolicy
from router.policy.build import build_policy
from router.policy.guard import QualityGuard, estimate
from router.policy.spec import GuardParams, parse_policy
from router.profiles import RequestFeatures
from router.quality import BpbTracker, HeadQuality, drift, drifted
from router.router import Router
from router.state import LiveState
from tests.router.helpers import heads

HEADS = ["32k", "131k", "262k"]
FEATS = RequestFeatures(prompt_bytes=800, max_tokens=16)
MANIFEST_BPB = {"32k": 1.05, "131k": 1.0, "262k": 0.98}
# B=1 under the threshold rule routes to the smallest head that is eligible.
GUARDED = {"name": "threshold", "params": {"min_dwell_s": 0, "max_switches_per_min": 0},
           "guard": {"max_bpb": 1.4, "margin": 0.1, "min_samples": 2, "min_dwell_s": 10,
                     "max_switches_per_min": 0}}


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def setup() -> tuple[Router, LiveState, Clock]:
    profiles = [dataclasses.replace(p, bpb=MANIFEST_BPB[p.name]) for p in heads()]
    state = LiveState.for_profiles(profiles, window_s=0, bpb_alpha=1.0)  # alpha 1: last sample
    clock = Clock()
    return Router(profiles, DEVICES["a100-80"], state, GUARDED, clock=clock), state, clock


def _observe(state: LiveState, head: str, bpb: float, n: int = 1) -> None:
    for _ in range(n):
        state.quality.observe(head, bpb)


def test_head_over_its_bound_is_excluded_after_min_samples(setup) -> None:
    router, state, _ = setup
    assert router.decide(FEATS).head == "32k"
    _observe(state, "32k", 1.6)
    d = router.decide(FEATS)  # one sample: judged only from min_samples on
    assert d.head == "32k" and "kept 32k (bpb 1.60 > 1.40; 1/2 samples)" in d.reason
    _observe(state, "32k", 1.6)
    d = router.decide(FEATS)
    assert d.head == "131k"
    assert "guard: excluded 32k (bpb 1.60 > 1.40)" in d.reason
    assert d.to_record()["reason"] == d.reason
    assert router.active_policy.excluded() == {"32k"}  # type: ignore[attr-defined]


def test_readmission_waits_for_the_dwell(setup) -> None:
    router, state, clock = setup
    _observe(state, "32k", 1.6, 2)
    assert router.decide(FEATS).head == "131k"  # excluded at t=1000, dwell 10 s
    # Once 32k's figure is stale (min_samples × 3 heads = 6 newer samples elsewhere), 131k's
    # stands in for it: 1.0 × 1.05/1.0 = 1.05.
    _observe(state, "131k", 1.0, 6)
    clock.t += 5
    d = router.decide(FEATS)
    assert d.head == "131k" and "excluded 32k (bpb est. from 131k 1.05, bound 1.40; " \
        "readmission held: dwell)" in d.reason
    clock.t += 6
    d = router.decide(FEATS)
    assert d.head == "32k"
    assert "guard: readmitted 32k (bpb est. from 131k 1.05 < 1.40 less margin)" in d.reason
    assert router.active_policy.excluded() == frozenset()  # type: ignore[attr-defined]


def test_readmission_needs_the_hysteresis_margin(setup) -> None:
    router, state, clock = setup
    _observe(state, "32k", 1.6, 2)
    assert router.decide(FEATS).head == "131k"
    # est. 1.25 × 1.05 = 1.31: inside the bound 1.40 but not by the 10% margin (1.26).
    _observe(state, "131k", 1.25, 6)
    clock.t += 60
    d = router.decide(FEATS)
    assert d.head == "131k" and "readmission held: hysteresis" in d.reason
    _observe(state, "131k", 1.1)  # est. 1.155 < 1.26
    assert router.decide(FEATS).head == "32k"


def test_flap_cap_limits_moves_per_head(setup) -> None:
    router, state, clock = setup
    doc = {**GUARDED, "guard": {**GUARDED["guard"], "min_dwell_s": 0,  # type: ignore[dict-item]
                                "max_switches_per_min": 1}}
    router.set_policy(doc, "test")
    assert router.decide(FEATS).head == "32k"  # first judgement: no move counted
    _observe(state, "32k", 1.6, 2)
    assert router.decide(FEATS).head == "131k"  # move 1 of 1 this minute
    _observe(state, "131k", 0.9, 6)
    d = router.decide(FEATS)
    assert d.head == "131k" and "readmission held: flap_cap" in d.reason
    clock.t += 61
    assert router.decide(FEATS).head == "32k"


def test_every_head_over_its_bound_suspends_the_guard(setup) -> None:
    router, state, _ = setup
    for h in HEADS:  # 2 samples each; 32k's are 4 requests old, still fresh (stale after 6)
        _observe(state, h, 5.0, 2)
    d = router.decide(FEATS)
    assert d.head == "32k"  # the policy's own choice among all heads
    assert "every head is over its bound, so none is excluded" in d.reason


def test_relative_bound_uses_the_manifest_and_the_tighter_wins() -> None:
    h = dataclasses.replace(heads()[0], bpb=1.0)
    inner = build_policy(parse_policy({"name": "cost"}, HEADS), DEVICES["a100-80"])
    assert QualityGuard(inner, GuardParams(max_rel=0.2)).bound(h) == pytest.approx(1.2)
    assert QualityGuard(inner, GuardParams(max_bpb=1.1, max_rel=0.2)).bound(h) == 1.1
    assert QualityGuard(inner, GuardParams(max_rel=0.2)).bound(heads()[0]) is None


def test_estimate_borrows_the_freshest_head_once_its_own_is_stale() -> None:
    q = {"32k": HeadQuality(2.0, 5, 3), "131k": HeadQuality(1.0, 4, 5),
         "262k": HeadQuality(0.5, 9, 4)}
    manifest = {"32k": 1.1, "131k": 1.0, "262k": 1.0}
    assert estimate("32k", q, manifest, 3, True) == (2.0, "", 5)  # 2 newer: still its own
    value, src, n = estimate("32k", q, manifest, 2, True)
    assert value == pytest.approx(1.1) and src == " est. from 131k" and n == 4
    assert estimate("32k", q, manifest, 2, False) == (None, "", 0)  # stale: no judgement
    assert estimate("131k", q, manifest, 2, True) == (1.0, "", 4)  # the freshest keeps its own


def test_per_head_bounds_move_traffic_off_one_head(setup) -> None:
    router, state, _ = setup
    router.set_policy({**GUARDED, "guard": {"bounds": {"32k": 1.4}, "min_samples": 2,
                                            "min_dwell_s": 0}}, "test")
    for h in HEADS:  # hard traffic for every head; only 32k has a bound
        _observe(state, h, 5.0, 2)
    d = router.decide(FEATS)
    assert d.head == "131k" and "guard: excluded 32k (bpb 5.00 > 1.40)" in d.reason


def test_guard_is_part_of_the_policy_document(setup) -> None:
    router, _, _ = setup
    doc = router.policy_doc
    assert doc["guard"]["max_bpb"] == 1.4 and doc["guard"]["max_rel"] is None
    assert parse_policy(doc, HEADS) == parse_policy(GUARDED, HEADS)
    version = router.set_policy({"name": "cost", "params": {}}, "test")
    assert "guard" not in router.policy_doc and router.version == version
    assert router.dry_run(GUARDED) == []  # no recent requests: nothing to replay


@pytest.mark.parametrize(
    ("guard", "name", "field"),
    [
        ({"max_bpb": -1}, "cost", "guard.max_bpb"),
        ({"max_bpb": 0}, "cost", "guard.max_bpb"),
        ({"margin": 0.1}, "cost", "guard"),
        ({"max_rel": 0.1, "bogus": 1}, "cost", "guard.bogus"),
        ({"max_rel": 0.1, "min_samples": 1.5}, "cost", "guard.min_samples"),
        ({"max_bpb": 1.4}, "pinned", "guard"),
        ({"bounds": {"9k": 1.0}}, "cost", "guard.bounds.9k"),
        ({"bounds": {"32k": 0}}, "cost", "guard.bounds"),
        ([1], "cost", "guard"),
    ],
)
def test_bad_guards_name_the_field(guard: object, name: str, field: str) -> None:
    params = {"head": "32k"} if name == "pinned" else {}
    with pytest.raises(InvalidPolicy) as e:
        parse_policy({"name": name, "params": params, "guard": guard}, HEADS)
    assert e.value.field == field


def test_tracker_means_then_smooths_and_drift_flags() -> None:
    t = BpbTracker(["a"], alpha=0.5)
    assert t.observe("a", 1.0).bpb == 1.0
    assert t.observe("a", 2.0).bpb == pytest.approx(1.5)  # mean of the first 1/alpha
    q = t.observe("a", 3.0)
    assert q.bpb == pytest.approx(2.25) and q.samples == 3 and q.last_seq == 3
    assert drift(1.1, 1.0) == pytest.approx(0.1) and drift(None, 1.0) is None
    assert drifted(q, 2.0, 0.1, 3) and not drifted(q, 2.0, 0.2, 3) and not drifted(q, 2.0, 0.1, 4)
    with pytest.raises(ValueError):
        t.observe("a", float("nan"))
    t2 = BpbTracker(["a", "b"], alpha=0.5)  # window: 2 scored requests
    t2.observe("a", 1.0)
    t2.observe("b", 1.0)
    assert t2.observe("a", 3.0).bpb == pytest.approx(2.0)  # 1 request elsewhere: smoothed
    t2.observe("b", 1.0)
    t2.observe("b", 1.0)
    assert t2.observe("a", 5.0) == HeadQuality(5.0, 1, 6)  # a window elsewhere: starts over
