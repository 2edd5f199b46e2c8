"""Unit tests of the operations pieces: key rings, rate-limit windows, the audit log."""

from __future__ import annotations

import asyncio
import json

import pytest
from pydantic import SecretStr

from server.api.admin_policy import parse_if_match
from server.ops.audit import AuditLog
from server.ops.auth import KeyRing, admin_keyring, bearer, client_keyring
from server.ops.ratelimit import MemoryRateLimiter, RateLimits
from server.settings import Settings


def test_keyring_matches_by_name_and_rejects_others() -> None:
    ring = KeyRing({"alice": "k-alice", "bob": "k-bob"})
    assert ring.match("k-bob") == "bob" and ring.match("k-alice") == "alice"
    assert ring.match("k-bo") is None and ring.match("") is None
    assert not KeyRing({}) and len(ring) == 2
    with pytest.raises(ValueError):
        KeyRing({"empty": ""})


def test_keyrings_from_settings_and_files(tmp_path) -> None:
    f = tmp_path / "keys.json"
    f.write_text(json.dumps({"carol": "k-carol"}))
    s = Settings(admin_token=SecretStr("root"), admin_actor="ops",
                 admin_tokens={"dave": SecretStr("k-dave")}, api_keys_file=f)
    admins = admin_keyring(s)
    assert admins.match("root") == "ops" and admins.match("k-dave") == "dave"
    assert client_keyring(s).match("k-carol") == "carol"
    f.write_text("[1, 2]")
    with pytest.raises(ValueError, match="name -> secret"):
        client_keyring(s)


def test_bearer_parsing() -> None:
    assert bearer("Bearer abc") == "abc" and bearer("bearer  abc ") == "abc"
    assert bearer("Basic abc") is None and bearer("Bearer ") is None and bearer("") is None


def test_memory_rate_limiter_windows() -> None:
    rl = MemoryRateLimiter(RateLimits(rpm=2, tpm=100))
    t = 120.0  # the start of a window
    assert rl.acquire_now("a", 10, t) is None
    assert rl.acquire_now("a", 10, t + 1) is None
    assert rl.acquire_now("a", 10, t + 2) == 58  # third request in the minute
    assert rl.acquire_now("b", 95, t + 2) is None  # keys are independent
    assert rl.acquire_now("b", 10, t + 2) is not None  # tokens/min over 100
    assert rl.acquire_now("a", 10, t + 60) is None  # a new window
    assert asyncio.run(MemoryRateLimiter(RateLimits(0, 0)).acquire("x", 10**9)) is None


def test_audit_log_appends_json_lines(tmp_path) -> None:
    log = AuditLog(tmp_path / "sub" / "audit.jsonl")
    log.append("alice", "policy.set", {"v": 1}, {"v": 2})
    log.append("bob", "head.drain", {"state": "active"}, {"state": "drained"})
    lines = (tmp_path / "sub" / "audit.jsonl").read_text().splitlines()
    assert len(lines) == 2
    first = json.loads(lines[0])
    assert set(first) == {"ts", "actor", "action", "before", "after"}
    assert first["actor"] == "alice" and first["after"] == {"v": 2}
    assert [r["actor"] for r in log.tail(5)] == ["alice", "bob"]


def test_if_match_forms() -> None:
    assert parse_if_match(None) is None and parse_if_match("*") is None
    assert parse_if_match("3") == 3 and parse_if_match('"4"') == 4 and parse_if_match('W/"5"') == 5
    with pytest.raises(Exception, match="If-Match"):
        parse_if_match("abc")
