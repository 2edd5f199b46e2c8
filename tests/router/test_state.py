from __future__ import annotations

import threading

import pytest

from router.errors import UnknownHead
from router.state import LiveState
from tests.router.helpers import heads


def test_lambda_per_head_and_total() -> None:
    state = LiveState({"a": 1000.0, "b": 3000.0, "c": 0.0})
    assert state.lam() == 0.0
    state.add_served("a", 500, 100)
    state.add_served("b", 300, 50)
    state.add_served("c", 200, 40)
    assert state.lam("a") == pytest.approx(0.5)
    assert state.lam("b") == pytest.approx(0.1)
    assert state.lam("c") == 0.0  # no training bytes: nothing to amortize
    assert state.lam() == pytest.approx(1000 / 3000)  # the shared backbone trained once
    snap = state.snapshot()
    assert snap.served_tokens == {"a": 100, "b": 50, "c": 40}
    assert LiveState({"x": 0.0}).lam() == 0.0


def test_snapshot_is_frozen_and_detached() -> None:
    state = LiveState.for_profiles(heads())
    state.set_load("32k", 3, 1)
    snap = state.snapshot()
    state.set_load("32k", 9, 9)
    assert snap.running["32k"] == 3 and snap.waiting["32k"] == 1
    with pytest.raises(TypeError):
        snap.running["32k"] = 5  # type: ignore[index]


def test_unknown_head_and_negative_counts() -> None:
    state = LiveState({"a": 1.0})
    with pytest.raises(UnknownHead, match="'zz'"):
        state.add_served("zz", 1, 1)
    with pytest.raises(UnknownHead):
        state.lam("zz")
    with pytest.raises(ValueError):
        state.set_load("a", -1, 0)


def test_concurrent_updates_are_not_lost() -> None:
    state = LiveState({"a": 1.0})

    def work() -> None:
        for _ in range(2000):
            state.add_served("a", 3, 1)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    snap = state.snapshot()
    assert snap.served_bytes["a"] == 8 * 2000 * 3 and snap.served_tokens["a"] == 8 * 2000


def test_restore_served() -> None:
    state = LiveState({"a": 100.0})
    state.restore_served({"a": 250})
    assert state.lam() == pytest.approx(2.5)
