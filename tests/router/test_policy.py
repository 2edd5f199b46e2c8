from __future__ import annotations

import pytest

from router.cost import context_tokens, lifecycle_cost
from router.devices import DEVICES
from router.errors import InvalidPolicy
from router.policy import (
    LifecycleParams,
    LifecyclePolicy,
    PinnedPolicy,
    parse_policy,
)
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
    head, reason, costs = PinnedPolicy("131k").decide(FEATS, snap, heads())
    assert head == "131k" and "131k" in reason and costs == {}


def test_lifecycle_uses_live_batch_and_lambda() -> None:
    profiles = heads()
    state = LiveState.for_profiles(profiles)
    policy = LifecyclePolicy(DEVICES["h100-sxm"], LifecycleParams(margin=0.0))
    head, reason, costs = policy.decide(FEATS, state.snapshot(), profiles)
    assert head == "32k" and "B=1" in reason and set(costs) == set(HEADS)
    for h in HEADS:
        state.set_load(h, 255, 0)
    state.add_served("32k", int(1e13), 1)  # λ = 1e13 / 1e12 (the shared backbone) = 10
    head, reason, _ = policy.decide(FEATS, state.snapshot(), profiles)
    assert head == "262k"
    assert reason.startswith("lifecycle: 262k cheapest at B=256, λ=10 (262k ")
    override = LifecyclePolicy(DEVICES["h100-sxm"], LifecycleParams(0.0, lambda_override=0.0))
    assert override.decide(FEATS, state.snapshot(), profiles)[0] == "32k"


def test_lifecycle_hysteresis() -> None:
    profiles, h100 = [heads()[0], heads()[2]], DEVICES["h100-sxm"]  # 32k and 262k
    state = LiveState.for_profiles(profiles)
    for h in ("32k", "262k"):
        state.set_load(h, 255, 0)
    snap = state.snapshot()
    parts = {p.name: lifecycle_cost(p, h100, 256, 1.0, context_tokens(p, FEATS)) for p in profiles}
    # λ at which 262k undercuts 32k by 3%: train_262 + λ·infer_262 = 0.97·(train_32 + λ·infer_32)
    small, big = parts["32k"], parts["262k"]
    lam = (0.97 * small.train - big.train) / (big.infer - 0.97 * small.infer)
    assert lam > 0

    def settled(margin: float, lam_now: float) -> LifecyclePolicy:
        policy = LifecyclePolicy(h100, LifecycleParams(margin, lambda_override=0.0))
        assert policy.decide(FEATS, snap, profiles)[0] == "32k"  # preferred at λ=0
        policy.params = LifecycleParams(margin, lambda_override=lam_now)
        return policy

    head, reason, costs = settled(0.05, lam).decide(FEATS, snap, profiles)
    assert min(costs, key=costs.__getitem__) == "262k"
    assert head == "32k" and "kept 32k" in reason and "hysteresis" in reason
    assert settled(0.0, lam).decide(FEATS, snap, profiles)[0] == "262k"
    assert settled(0.05, 10 * lam).decide(FEATS, snap, profiles)[0] == "262k"  # a clear gain
