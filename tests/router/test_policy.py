from __future__ import annotations

import pytest

from kernels.devices import DEVICES
from router.cost import context_tokens, lifecycle_cost
from router.errors import InvalidPolicy
from router.policy.builtin import LifecyclePolicy, PinnedPolicy
from router.policy.spec import LifecycleParams, parse_policy
from router.profiles import RequestFeatures
from router.state import LiveState
from tests.router.helpers import heads

HEADS = ["32k", "131k", "262k"]
FEATS = RequestFeatures(prompt_bytes=8000, max_tokens=256)


@pytest.mark.parametrize(
    ("doc", "field"),
    [
        ([], "policy"),
        ({}, "name"),
        ({"name": "lifecycle", "colour": 1}, "colour"),
        ({"name": "fastest"}, "name"),
        ({"name": "lifecycle", "params": 3}, "params"),
        ({"name": "lifecycle", "params": {"margn": 0.1}}, "params.margn"),
        ({"name": "lifecycle", "params": {"margin": 1.5}}, "params.margin"),
        ({"name": "lifecycle", "params": {"margin": True}}, "params.margin"),
        ({"name": "lifecycle", "params": {"lambda_override": -1}}, "params.lambda_override"),
        ({"name": "lifecycle", "params": {"lambda_override": "1"}}, "params.lambda_override"),
        ({"name": "pinned"}, "params.head"),
        ({"name": "pinned", "params": {"head": "x"}}, "params.head"),
        ({"name": "pinned", "params": {"head": "32k", "margin": 0.1}}, "params.margin"),
    ],
)
def test_parse_errors_name_the_field(doc: object, field: str) -> None:
    with pytest.raises(InvalidPolicy) as err:
        parse_policy(doc, HEADS)
    assert err.value.field == field
    assert str(err.value).startswith(f"{field}: ")


def test_unknown_pinned_head_message() -> None:
    with pytest.raises(InvalidPolicy, match=r"^params\.head: unknown head 'x'"):
        parse_policy({"name": "pinned", "params": {"head": "x"}}, HEADS)


def test_parse_valid_documents_round_trip() -> None:
    spec = parse_policy({"name": "lifecycle"}, HEADS)
    assert spec.params == LifecycleParams()
    doc = {"name": "lifecycle", "params": {"margin": 0.1, "lambda_override": 2}}
    spec = parse_policy(doc, HEADS)
    assert spec.params == LifecycleParams(0.1, 2.0)
    assert parse_policy(spec.to_doc(), HEADS) == spec
    pinned = parse_policy({"name": "pinned", "params": {"head": "131k"}}, HEADS)
    assert pinned.to_doc() == {"name": "pinned", "params": {"head": "131k"}}


def test_pinned_policy() -> None:
    snap = LiveState.for_profiles(heads()).snapshot()
    c = PinnedPolicy("131k").decide(FEATS, snap, heads())
    assert c.head == "131k" and "131k" in c.reason and c.costs == {} and c.code == "pinned"


def test_lifecycle_uses_live_batch_and_lambda() -> None:
    profiles = heads(sunk=False)  # the paper's setting: every head's training still to pay
    state = LiveState.for_profiles(profiles)
    policy = LifecyclePolicy(DEVICES["h100-sxm"], LifecycleParams(margin=0.0, min_dwell_s=0))
    c = policy.decide(FEATS, state.snapshot(), profiles)
    assert c.head == "32k" and "B=1" in c.reason and set(c.costs) == set(HEADS)
    state.set_load("32k", 255, 0)  # live B is the engine's whole running batch
    state.add_served("32k", int(1e13), 1)  # λ = 1e13 / 1e12 (the shared backbone) = 10
    c = policy.decide(FEATS, state.snapshot(), profiles)
    assert c.head == "262k"
    assert c.reason.startswith("lifecycle: 262k cheapest at B=256, λ=10 (262k ")
    override = LifecyclePolicy(DEVICES["h100-sxm"], LifecycleParams(0.0, lambda_override=0.0))
    assert override.decide(FEATS, state.snapshot(), profiles).head == "32k"
    state.set_lambda_forecast(0.0)  # the operator's forecast replaces the measured λ
    fresh = LifecyclePolicy(DEVICES["h100-sxm"], LifecycleParams(0.0))
    assert fresh.decide(FEATS, state.snapshot(), profiles).head == "32k"


def _settled(margin: float, lam_now: float, **kw: float) -> tuple[LifecyclePolicy, list]:
    t = [0.0]
    h100 = DEVICES["h100-sxm"]
    policy = LifecyclePolicy(h100, LifecycleParams(margin, lambda_override=0.0, **kw),
                             clock=lambda: t[0])
    assert policy.decide(FEATS, _SNAP, _TWO).head == "32k"  # preferred at λ=0
    policy.params = LifecycleParams(margin, lambda_override=lam_now, **kw)
    return policy, t


_TWO = [heads(sunk=False)[0], heads(sunk=False)[2]]  # 32k and 262k, training not yet sunk
_state = LiveState.for_profiles(_TWO)
_state.set_load("32k", 255, 0)
_SNAP = _state.snapshot()


def _lam_for_gain(gain: float) -> float:
    """λ at which 262k undercuts 32k by `gain`: train_262 + λ·infer_262 = (1-gain)·(...)_32."""
    h100 = DEVICES["h100-sxm"]
    small, big = (lifecycle_cost(p, h100, 256, 1.0, context_tokens(p, FEATS)) for p in _TWO)
    lam = ((1 - gain) * small.train - big.train) / (big.infer - (1 - gain) * small.infer)
    assert lam > 0
    return lam


def test_lifecycle_hysteresis() -> None:
    lam = _lam_for_gain(0.03)
    c = _settled(0.05, lam, min_dwell_s=0)[0].decide(FEATS, _SNAP, _TWO)
    assert min(c.costs, key=c.costs.__getitem__) == "262k"
    assert c.head == "32k" and "kept 32k" in c.reason and "hysteresis" in c.reason
    assert c.code == "hysteresis"
    assert _settled(0.0, lam, min_dwell_s=0)[0].decide(FEATS, _SNAP, _TWO).head == "262k"
    assert _settled(0.05, 10 * lam, min_dwell_s=0)[0].decide(FEATS, _SNAP, _TWO).head == "262k"


def test_minimum_dwell_and_switch_cap() -> None:
    lam_big, lam_small = 10 * _lam_for_gain(0.03), 0.0
    policy, t = _settled(0.0, lam_big, min_dwell_s=5.0, max_switches_per_min=2)
    # The first choice starts no dwell: the first clear gain moves traffic at once.
    assert policy.decide(FEATS, _SNAP, _TWO).head == "262k"
    policy.params = LifecycleParams(0.0, lambda_override=lam_small, min_dwell_s=5.0,
                                    max_switches_per_min=2)
    c = policy.decide(FEATS, _SNAP, _TWO)
    assert c.head == "262k" and c.code == "dwell" and "minimum dwell" in c.reason
    t[0] = 5.0
    assert policy.decide(FEATS, _SNAP, _TWO).head == "32k"  # 2nd switch within a minute
    policy.params = LifecycleParams(0.0, lambda_override=lam_big, min_dwell_s=5.0,
                                    max_switches_per_min=2)
    t[0] = 11.0
    c = policy.decide(FEATS, _SNAP, _TWO)
    assert c.head == "32k" and c.code == "flap_cap"
    t[0] = 61.0  # the first switch (t=0) left the 60 s window
    assert policy.decide(FEATS, _SNAP, _TWO).head == "262k"
    assert policy.stability.switches == 3


def test_sunk_training_costs_do_not_route() -> None:
    """Existing heads: λ ≈ 0 must not mean "the smallest head whatever B" (sunk costs)."""
    state = LiveState.for_profiles(heads())
    state.set_load("32k", 255, 0)
    policy = LifecyclePolicy(DEVICES["h100-sxm"], LifecycleParams(0.0, lambda_override=0.0))
    c = policy.decide(FEATS, state.snapshot(), heads())
    assert c.head == "262k"  # B=256 on an H100: the big head's compression wins
    cost = parse_policy({"name": "cost"}, HEADS)
    from router.policy.build import build_policy
    same = build_policy(cost, DEVICES["h100-sxm"]).decide(FEATS, state.snapshot(), heads())
    assert same.head == c.head and same.costs == pytest.approx(c.costs)
    # A head not yet paid for ranks behind every sunk one at λ = 0.
    mixed = [heads()[0], heads(sunk=False)[2]]
    fresh = LifecyclePolicy(DEVICES["h100-sxm"], LifecycleParams(0.0, lambda_override=0.0))
    assert fresh.decide(FEATS, state.snapshot(), mixed).head == "32k"
