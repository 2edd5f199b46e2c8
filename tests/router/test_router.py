from __future__ import annotations

import threading

import pytest

from kernels.devices import DEVICES
from router.errors import InvalidPolicy, RouterError, UnknownHead
from router.profiles import RequestFeatures
from router.router import Router
from router.state import LiveState
from tests.router.helpers import heads

FEATS = RequestFeatures(prompt_bytes=2000, max_tokens=128)


def _router(doc: dict | None = None) -> Router:
    profiles = heads()
    state = LiveState.for_profiles(profiles)
    return Router(profiles, DEVICES["h100-sxm"], state, doc or {"name": "lifecycle"})


def test_lifecycle_decision_is_explained() -> None:
    decision = _router().decide(FEATS)
    assert decision.head == "32k" and decision.policy == "lifecycle" and decision.version == 1
    assert decision.reason.startswith("lifecycle: 32k cheapest at B=1, λ=0 (32k ")
    assert set(decision.costs) == {"32k", "131k", "262k"}


def test_request_pin_overrides_policy() -> None:
    router = _router()
    decision = router.decide(RequestFeatures(10, 10, pinned_head="262k"))
    assert decision.head == "262k" and decision.policy == "request_pin"
    assert "overrides the lifecycle policy" in decision.reason
    with pytest.raises(UnknownHead, match="'9k'"):
        router.decide(RequestFeatures(10, 10, pinned_head="9k"))


def test_set_policy_bumps_version_and_records_actor() -> None:
    router = _router()
    before = router.changed_at
    version = router.set_policy({"name": "pinned", "params": {"head": "131k"}}, actor="alice")
    assert version == router.version == 2
    assert router.changed_by == "alice" and router.changed_at >= before
    assert router.policy_doc == {"name": "pinned", "params": {"head": "131k"}}
    decision = router.decide(FEATS)
    assert (decision.head, decision.policy, decision.version) == ("131k", "pinned", 2)


def test_invalid_policy_changes_nothing() -> None:
    router = _router()
    doc = router.policy_doc
    with pytest.raises(InvalidPolicy, match=r"^params\.head: unknown head 'x'"):
        router.set_policy({"name": "pinned", "params": {"head": "x"}}, actor="bob")
    assert router.version == 1 and router.policy_doc == doc and router.changed_by == "startup"


def test_concurrent_switches_are_atomic() -> None:
    router = _router()
    docs = [{"name": "pinned", "params": {"head": h}} for h in ("32k", "131k", "262k")]
    seen: list[tuple[str, int]] = []

    def writer(i: int) -> None:
        for j in range(50):
            router.set_policy(docs[(i + j) % 3], actor=f"w{i}")

    def reader() -> None:
        for _ in range(300):
            d = router.decide(FEATS)
            seen.append((d.head, d.version))

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(4)]
    threads.append(threading.Thread(target=reader))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert router.version == 1 + 4 * 50  # no lost increments
    versions = [v for _, v in seen]
    assert versions == sorted(versions)  # one reader never sees time go backwards


def test_constructor_validation() -> None:
    profiles = heads()
    with pytest.raises(RouterError, match="duplicate"):
        Router(profiles + profiles[:1], DEVICES["cpu"], LiveState.for_profiles(profiles), {})
    with pytest.raises(RouterError, match="live state"):
        Router(profiles, DEVICES["cpu"], LiveState({"32k": 1.0}), {"name": "lifecycle"})
    with pytest.raises(InvalidPolicy):
        Router(profiles, DEVICES["cpu"], LiveState.for_profiles(profiles), {"name": "nope"})
