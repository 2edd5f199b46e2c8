"""Operator hooks on the router: drain/undrain, optimistic policy versions, rollback, dry run."""

from __future__ import annotations

import pytest

from kernels.devices import DEVICES
from router.errors import HeadUnavailable, RouterError, VersionConflict
from router.profiles import RequestFeatures
from router.router import Router
from router.state import LiveState
from tests.router.helpers import heads

FEATS = RequestFeatures(prompt_bytes=2000, max_tokens=128)


def _router(doc: dict | None = None) -> Router:
    profiles = heads(sunk=False)  # λ = 0: lifecycle ranks by C_train, a clear 32k
    return Router(profiles, DEVICES["h100-sxm"], LiveState.for_profiles(profiles),
                  doc or {"name": "lifecycle"})


def test_drained_head_is_skipped_then_restored() -> None:
    router = _router()
    assert router.decide(FEATS).head == "32k"
    router.set_drained("32k", True)
    decision = router.decide(FEATS)
    assert decision.head != "32k" and "32k" not in decision.costs
    router.set_drained("32k", False)
    assert router.decide(FEATS).head == "32k"


def test_pin_to_drained_head_is_unavailable() -> None:
    router = _router()
    router.set_drained("262k", True)
    with pytest.raises(HeadUnavailable, match="262k"):
        router.decide(RequestFeatures(10, 10, pinned_head="262k"))
    router.set_policy({"name": "pinned", "params": {"head": "262k"}}, "t")
    with pytest.raises(HeadUnavailable):
        router.decide(FEATS)


def test_all_heads_drained_is_unavailable() -> None:
    router = _router()
    for h in router.heads:
        router.set_drained(h, True)
    with pytest.raises(HeadUnavailable, match="every head"):
        router.decide(FEATS)


def test_stale_version_conflicts_and_changes_nothing() -> None:
    router = _router()
    assert router.set_policy({"name": "pinned", "params": {"head": "131k"}}, "a",
                             expected_version=1) == 2
    with pytest.raises(VersionConflict) as err:
        router.set_policy({"name": "lifecycle"}, "b", expected_version=1)
    assert err.value.active == 2 and router.version == 2 and router.policy_doc["name"] == "pinned"


def test_rollback_restores_previous_policy_with_a_new_version() -> None:
    router = _router()
    with pytest.raises(RouterError, match="no previous"):
        router.rollback("a")
    router.set_policy({"name": "pinned", "params": {"head": "131k"}}, "a")
    assert router.rollback("b") == 3
    assert router.policy_doc["name"] == "lifecycle" and router.changed_by == "b"
    with pytest.raises(RouterError):
        router.rollback("b")


def test_dry_run_replays_recent_requests_without_switching() -> None:
    router = _router()
    for _ in range(3):
        router.decide(FEATS)
    router.decide(RequestFeatures(10, 10, pinned_head="131k"))
    would = router.dry_run({"name": "pinned", "params": {"head": "262k"}}, n=10)
    assert [d.head for d in would] == ["262k", "262k", "262k", "131k"]
    assert [d.head for _, d in router.recent(10)] == ["32k", "32k", "32k", "131k"]
    assert router.version == 1
