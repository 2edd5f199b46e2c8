"""Admin operations on a real gateway: heads, drain/undrain, state, If-Match, dry run,
rollback, and the audit trail."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.conftest import ADMIN_TOKEN, start_gateway, stop_gateway

pytestmark = pytest.mark.integration
AUTH = {"authorization": f"Bearer {ADMIN_TOKEN}"}


def _complete(url: str, model: str = "tiny") -> httpx.Response:
    return httpx.post(f"{url}/v1/completions", timeout=30,
                      json={"model": model, "prompt": "hello", "max_tokens": 2})


def test_heads_and_state(gateway):
    heads = httpx.get(f"{gateway.url}/admin/heads", headers=AUTH, timeout=10).json()["heads"]
    assert [h["name"] for h in heads] == ["1k", "4k", "8k"]
    for h in heads:
        assert {"vocab_size", "bytes_per_token", "bpb", "live_batch", "max_batch", "queue",
                "state"} <= set(h)
        assert h["state"] == "active"
    assert _complete(gateway.url).status_code == 200
    state = httpx.get(f"{gateway.url}/admin/state", headers=AUTH, timeout=10).json()
    assert state["lambda"]["all"] > 0 and sum(state["counters"]["served_bytes"].values()) > 0
    assert state["policy"]["version"] >= 1 and state["calibration"]["status"]
    assert httpx.get(f"{gateway.url}/admin/state", timeout=10).status_code == 401


def test_heads_max_batch_is_admissions_kv_derived_value(gateway):
    heads = httpx.get(f"{gateway.url}/admin/heads", headers=AUTH, timeout=10).json()["heads"]
    adm = httpx.get(f"{gateway.url}/admin/admission", headers=AUTH, timeout=10).json()
    assert adm["enabled"]
    assert {h["name"]: h["max_batch"] for h in heads} == {
        name: v["max_batch"] for name, v in adm["heads"].items()}


def test_drain_skips_head_and_pins_get_503(gateway):
    url = gateway.url
    routed = _complete(url).headers["x-polyhead-head"]
    r = httpx.post(f"{url}/admin/heads/{routed}/drain", headers=AUTH, timeout=10)
    assert r.json() == {"head": routed, "state": "drained"}
    try:
        for _ in range(3):
            resp = _complete(url)
            assert resp.status_code == 200 and resp.headers["x-polyhead-head"] != routed
        pinned = _complete(url, f"tiny:{routed}")
        assert pinned.status_code == 503, pinned.text
        assert pinned.json()["error"]["type"] == "server_error"
        heads = httpx.get(f"{url}/admin/heads", headers=AUTH, timeout=10).json()["heads"]
        assert {h["name"]: h["state"] for h in heads}[routed] == "drained"
    finally:
        httpx.post(f"{url}/admin/heads/{routed}/undrain", headers=AUTH, timeout=10)
    assert _complete(url, f"tiny:{routed}").status_code == 200
    assert httpx.post(f"{url}/admin/heads/99k/drain", headers=AUTH,
                      timeout=10).status_code == 404


def test_if_match_dry_run_and_rollback(gateway):
    url = gateway.url
    for _ in range(3):
        _complete(url)
    before = httpx.get(f"{url}/admin/policy", headers=AUTH, timeout=10).json()
    v = before["version"]
    dry = httpx.put(f"{url}/admin/policy?dry_run=true&n=3", headers=AUTH, timeout=10,
                    json={"name": "pinned", "params": {"head": "8k"}}).json()
    assert dry["dry_run"] and dry["requests"] == 3
    assert dry["candidate_heads"] == {"8k": 3}
    assert httpx.get(f"{url}/admin/policy", headers=AUTH, timeout=10).json()["version"] == v

    stale = httpx.put(f"{url}/admin/policy", timeout=10, json={"name": "lifecycle"},
                      headers={**AUTH, "if-match": str(v - 1 if v > 1 else v + 5)})
    assert stale.status_code == 409 and stale.json()["error"]["code"] == "conflict"
    ok = httpx.put(f"{url}/admin/policy", timeout=10, headers={**AUTH, "if-match": f'"{v}"'},
                   json={"name": "pinned", "params": {"head": "8k"}})
    assert ok.status_code == 200 and ok.json()["version"] == v + 1
    back = httpx.post(f"{url}/admin/policy/rollback", headers=AUTH, timeout=10).json()
    assert back["name"] == before["name"] and back["params"] == before["params"]
    assert back["version"] == v + 2

    audit = httpx.get(f"{url}/admin/audit?n=10", headers=AUTH, timeout=10).json()["records"]
    actions = [a["action"] for a in audit]
    assert actions[-2:] == ["policy.set", "policy.rollback"]
    assert audit[-1]["actor"] == "admin" and audit[-1]["after"]["version"] == v + 2


def test_named_admin_tokens_audit_file_never_holds_secrets(tiny_model_dir, tmp_path):
    audit = tmp_path / "audit.jsonl"
    gw = start_gateway(tiny_model_dir, tmp_path / "gw.log",
                       POLYHEAD_ADMIN_TOKENS=json.dumps({"alice": "alice-secret-1"}),
                       POLYHEAD_AUDIT_LOG=str(audit), POLYHEAD_LOG_FORMAT="json")
    try:
        h = {"authorization": "Bearer alice-secret-1"}
        assert httpx.post(f"{gw.url}/admin/heads/4k/drain", headers=h, timeout=10).is_success
        assert httpx.post(f"{gw.url}/admin/heads/4k/undrain", headers=h, timeout=10).is_success
        bad = httpx.get(f"{gw.url}/admin/heads", timeout=10,
                        headers={"authorization": "Bearer alice-secret-2"})
        assert bad.status_code == 401
    finally:
        assert stop_gateway(gw) == 0
    records = [json.loads(line) for line in audit.read_text().splitlines()]
    assert [(r["actor"], r["action"]) for r in records] == [("alice", "head.drain"),
                                                          ("alice", "head.undrain")]
    assert "alice-secret" not in audit.read_text() and "alice-secret" not in gw.log()
