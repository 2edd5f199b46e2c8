from __future__ import annotations

import json

import pytest

from router.state import LiveState
from router.store import FileStore, Increments, MemoryStore, StateSync


def test_file_store_round_trip_and_atomic_write(tmp_path) -> None:
    store = FileStore(tmp_path / "sub" / "lambda.json")
    assert store.load().served_bytes == {}
    store.add(Increments({"a": 10}, {"a": 2}))
    store.add(Increments({"a": 5, "b": 1}, {}, {"a/latin": 40}, {"a/latin": 9}))
    store.set_forecast(3.5)
    c = FileStore(store.path).load()
    assert c.served_bytes == {"a": 15, "b": 1} and c.served_tokens == {"a": 2}
    assert c.lambda_forecast == 3.5
    assert c.output_bytes == {"a/latin": 40} and c.output_tokens == {"a/latin": 9}
    assert [p.name for p in store.path.parent.iterdir()] == ["lambda.json"]  # no temp left
    json.loads(store.path.read_text())
    store.path.write_text("{broken")
    assert FileStore(store.path).load().served_bytes == {}  # corrupt: start from zero


def test_counters_survive_a_restart(tmp_path) -> None:
    path = tmp_path / "lambda.json"
    state = LiveState({"a": 100.0})
    sync = StateSync(state, FileStore(path))
    sync.restore()
    state.add_served("a", 250, 50)
    sync.flush()
    sync.set_forecast(7.0)
    again = LiveState({"a": 100.0})
    StateSync(again, FileStore(path)).restore()
    assert again.lam() == pytest.approx(2.5) and again.snapshot().served_tokens["a"] == 50
    assert again.snapshot().effective_lam() == 7.0


def test_replicas_share_counters_without_double_counting() -> None:
    store = MemoryStore()
    one, two = LiveState({"a": 1000.0}), LiveState({"a": 1000.0})
    s1, s2 = StateSync(one, store), StateSync(two, store)
    s1.restore()
    s2.restore()
    one.add_served("a", 100, 1)
    two.add_served("a", 30, 1)
    s1.flush()
    s2.flush()
    s1.flush()
    assert store.load().served_bytes == {"a": 130}
    assert one.snapshot().served_bytes["a"] == 130 == two.snapshot().served_bytes["a"]
    two.add_served("a", 5, 0)
    s2.flush()
    s2.flush()  # nothing new: nothing added
    assert store.load().served_bytes == {"a": 135}


class _Flaky(MemoryStore):
    fail = True

    def add(self, inc: Increments) -> None:
        if self.fail:
            raise ConnectionError("down")
        super().add(inc)


def test_failed_flush_keeps_the_increments() -> None:
    store, state = _Flaky(), LiveState({"a": 1.0})
    sync = StateSync(state, store)
    state.add_served("a", 10, 1)
    with pytest.raises(ConnectionError):
        sync.flush()
    store.fail = False
    sync.flush()
    assert store.load().served_bytes == {"a": 10}


def test_output_compression_counters_persist_and_are_shared(tmp_path) -> None:
    path = tmp_path / "lambda.json"
    one, two = LiveState({"a": 1.0, "b": 1.0}), LiveState({"a": 1.0, "b": 1.0})
    s1, s2 = StateSync(one, FileStore(path)), StateSync(two, FileStore(path))
    s1.restore()
    s2.restore()
    one.add_output("a", "cyrillic", 800, 100)
    two.add_output("a", "cyrillic", 200, 100)
    two.add_output("b", "latin", 50, 10)
    s1.flush()
    s2.flush()
    s1.flush()
    for state in (one, two):
        snap = state.snapshot()
        assert snap.output_bytes == {"a/cyrillic": 1000, "b/latin": 50}
        assert snap.output_tokens == {"a/cyrillic": 200, "b/latin": 10}
    again = LiveState({"a": 1.0})  # head b retired: its keys are not restored
    StateSync(again, FileStore(path)).restore()
    assert again.snapshot().output_bytes == {"a/cyrillic": 1000}
