"""The routing policy survives a gateway restart (file store) and reaches every replica
within a second (Redis pub/sub plus a version check)."""

from __future__ import annotations

import time

import httpx
import pytest

from router.store import FileStore, MemoryStore, PolicyRecord
from tests.conftest import ADMIN_TOKEN, start_gateway, stop_gateway

ADMIN = {"authorization": f"Bearer {ADMIN_TOKEN}"}
POLICY = {"name": "pinned", "params": {"head": "4k"}}


def _rec(version: int, name: str = "cost") -> PolicyRecord:
    return PolicyRecord({"name": name, "params": {}}, version, "admin", 1.0)


@pytest.mark.parametrize("kind", ["file", "memory"])
def test_store_keeps_only_newer_policy_versions(tmp_path, kind) -> None:
    store = FileStore(tmp_path / "lambda.json") if kind == "file" else MemoryStore()
    assert store.load_policy() is None
    assert store.save_policy(_rec(3))
    assert not store.save_policy(_rec(3, "lifecycle"))  # same version: a stale replica
    assert not store.save_policy(_rec(2, "lifecycle"))
    assert store.load_policy() == _rec(3)
    assert store.save_policy(_rec(4, "lifecycle"))
    assert store.load_policy() == _rec(4, "lifecycle")


def _put(url: str, doc: dict) -> dict:
    r = httpx.put(f"{url}/admin/policy", headers=ADMIN, json=doc, timeout=10)
    assert r.status_code == 200, r.text
    return r.json()


def _get(url: str) -> dict:
    r = httpx.get(f"{url}/admin/policy", headers=ADMIN, timeout=10)
    assert r.status_code == 200, r.text
    return r.json()


@pytest.mark.integration
def test_policy_survives_a_restart(tiny_model_dir, tmp_path) -> None:
    env = dict(POLYHEAD_ADMIN_TOKEN=ADMIN_TOKEN, POLYHEAD_BACKEND="echo",
               POLYHEAD_CACHE_DIR=str(tmp_path / "cache"))
    gw = start_gateway(tiny_model_dir, tmp_path / "first.log", **env)
    try:
        assert _get(gw.url)["version"] == 1
        _put(gw.url, POLICY)
        set_ = _put(gw.url, {"name": "lifecycle", "params": {}})
    finally:
        assert stop_gateway(gw) == 0
    assert set_["version"] == 3
    gw = start_gateway(tiny_model_dir, tmp_path / "second.log", **env)
    try:
        got = _get(gw.url)
        assert got == set_
        assert _put(gw.url, POLICY)["version"] == 4  # versions go on from the restored one
    finally:
        assert stop_gateway(gw) == 0


def _until(url: str, version: int, deadline_s: float) -> dict:
    deadline = time.monotonic() + deadline_s
    while True:
        got = _get(url)
        if got["version"] >= version or time.monotonic() > deadline:
            return got
        time.sleep(0.02)


@pytest.mark.integration
def test_policy_reaches_the_other_replica_within_a_second(tiny_model_dir, tmp_path,
                                                          redis_server) -> None:
    env = dict(POLYHEAD_ADMIN_TOKEN=ADMIN_TOKEN, POLYHEAD_BACKEND="echo",
               POLYHEAD_REDIS_URL=redis_server.url)
    a = start_gateway(tiny_model_dir, tmp_path / "a.log", POLYHEAD_CACHE_DIR=str(tmp_path / "a"),
                      **env)
    b = start_gateway(tiny_model_dir, tmp_path / "b.log", POLYHEAD_CACHE_DIR=str(tmp_path / "b"),
                      **env)
    try:
        set_ = _put(a.url, POLICY)
        assert _until(b.url, set_["version"], 1.0) == set_
        # And back the other way, through a rollback on b.
        r = httpx.post(f"{b.url}/admin/policy/rollback", headers=ADMIN, timeout=10)
        assert r.status_code == 200, r.text
        back = r.json()
        assert _until(a.url, back["version"], 1.0) == back
        # A stale replica's write never overwrites the newer stored version.
        stored = redis_server.client().hget("polyhead:policy", "version")
        assert stored == str(back["version"])
    finally:
        assert stop_gateway(a) == 0 and stop_gateway(b) == 0
