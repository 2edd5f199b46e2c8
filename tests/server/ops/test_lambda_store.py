"""λ counters in a real Redis (Debian redis-server on loopback), shared by two replicas."""

from __future__ import annotations

import pytest

from router.state import LiveState
from router.store import FileStore, StateSync
from server.ops.lambda_store import RedisStore, make_store
from server.settings import Settings


def test_make_store_picks_redis_only_with_a_url(tmp_path) -> None:
    assert isinstance(make_store(Settings(cache_dir=tmp_path)), FileStore)
    store = make_store(Settings(cache_dir=tmp_path, redis_url="redis://127.0.0.1:1/0"))
    assert isinstance(store, RedisStore)


def test_two_replicas_share_lambda_and_survive_a_redis_restart(redis_server) -> None:
    training = {"32k": 1000.0, "262k": 1000.0}
    a, b = LiveState(training), LiveState(training)
    sa, sb = StateSync(a, RedisStore(redis_server.url)), StateSync(b, RedisStore(redis_server.url))
    sa.restore()
    sb.restore()
    a.add_served("32k", 300, 70)
    b.add_served("262k", 200, 40)
    sa.flush()
    sb.flush()
    sa.flush()
    assert a.lam() == pytest.approx(0.5) and b.lam() == pytest.approx(0.5)
    sb.set_forecast(12.0)
    sa.flush()
    assert a.snapshot().effective_lam() == 12.0
    redis_server.stop()
    with pytest.raises(Exception):  # noqa: B017 - redis' ConnectionError; kept for next time
        a.add_served("32k", 1, 1)
        sa.flush()
    redis_server.start()  # same port and append-only file
    sa.flush()
    fresh = LiveState(training)
    StateSync(fresh, RedisStore(redis_server.url)).restore()
    snap = fresh.snapshot()
    assert snap.served_bytes == {"32k": 301, "262k": 200}
    assert snap.served_tokens == {"32k": 71, "262k": 40} and snap.lambda_forecast == 12.0
