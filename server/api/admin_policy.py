"""Admin API for the routing policy (bearer admin token): GET/PUT /admin/policy (If-Match,
?dry_run=true) and POST /admin/policy/rollback, with their persistence and audit."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from typing import Any

from fastapi import APIRouter, Header, Query, Request

from router.errors import RouterError, VersionConflict
from router.router import Router
from router.store import PolicySync
from server.api.deps import AdminDep, AuditDep, MetricsDep, RouterDep
from server.errors import BadRequest, Conflict
from server.schemas import PolicyDocument

log = logging.getLogger(__name__)
router = APIRouter(prefix="/admin")


def policy_view(r: Router) -> dict:
    return {**r.policy_doc, "version": r.version, "changed_by": r.changed_by,
            "changed_at": r.changed_at}


@router.get("/policy")
async def get_policy(_: AdminDep, r: RouterDep) -> dict:
    return policy_view(r)


@router.put("/policy")
async def put_policy(
    doc: PolicyDocument, actor: AdminDep, r: RouterDep, m: MetricsDep, audit: AuditDep,
    request: Request,
    if_match: str | None = Header(default=None),
    dry_run: bool = Query(default=False),
    n: int = Query(default=100, ge=1, le=1000),
) -> dict:
    if dry_run:  # what the candidate would have decided on the last n requests; no change
        return dry_run_report(r, doc.model_dump(), n)
    before = policy_view(r)
    # Validated, then swapped atomically; requests already routed keep their head.
    # If-Match: a stale version gets 409 and changes nothing.
    version = r.set_policy(doc.model_dump(), actor, parse_if_match(if_match))
    await persist_policy(request, version)
    m.set_policy(doc.name, version, actor)
    m.policy_switches.labels("set").inc()
    audit.append(actor, "policy.set", before, policy_view(r))
    log.info("policy changed by %s: %s v%s -> %s v%s", actor, before["name"],
             before["version"], doc.name, version)
    return policy_view(r)


@router.post("/policy/rollback")
async def rollback(actor: AdminDep, r: RouterDep, m: MetricsDep, audit: AuditDep,
                   request: Request, if_match: str | None = Header(default=None)) -> dict:
    before = policy_view(r)
    if not r.can_rollback:
        raise Conflict("no previous policy to roll back to")
    try:
        version = r.rollback(actor, parse_if_match(if_match))
    except RouterError as e:
        if type(e) is RouterError:  # raced with another rollback; VersionConflict maps itself
            raise Conflict(str(e)) from None
        raise
    await persist_policy(request, version)
    m.set_policy(r.policy_doc["name"], version, actor)
    m.policy_switches.labels("rollback").inc()
    audit.append(actor, "policy.rollback", before, policy_view(r))
    return policy_view(r)



async def persist_policy(request: Request, version: int) -> None:
    """Save the policy just set as `version` (and, with Redis, publish it). If another
    replica stored a version at least as new first, this replica adopts that one and the
    change is answered 409."""
    ps: PolicySync | None = getattr(request.app.state, "policy_sync", None)
    if ps is None:
        return
    try:
        winner = await asyncio.to_thread(ps.push)
    except Exception as e:  # kept locally; the Redis version check saves it later
        log.error("policy v%d not persisted: %s", version, e)
        return
    if winner is not None:
        raise VersionConflict(version - 1, winner.version)


def parse_if_match(value: str | None) -> int | None:
    """`If-Match: 3`, `"3"` or `W/"3"` -> 3; absent -> None (no version check)."""
    if value is None or value.strip() == "*":
        return None
    raw = value.strip().removeprefix("W/").strip('"')
    if not raw.isdigit():
        raise BadRequest(f"If-Match must be a policy version number, got {value!r}",
                         param="if-match")
    return int(raw)


def dry_run_report(r: Router, doc: dict[str, Any], n: int) -> dict[str, Any]:
    """Decisions the candidate policy would make on the last `n` recorded requests (at the
    current live state), next to the decisions that were actually made."""
    recent = r.recent(n)
    would = r.dry_run(doc, n)
    rows: list[dict[str, Any]] = [
        {"prompt_bytes": f.prompt_bytes, "max_tokens": f.max_tokens, "pinned": f.pinned_head,
         "current": {"head": d.head, "policy": d.policy, "version": d.version},
         "candidate": {"head": w.head, "reason": w.reason}}
        for (f, d), w in zip(recent, would, strict=True)
    ]
    return {
        "dry_run": True,
        "policy": doc,
        "requests": len(rows),
        "changed": sum(row["current"]["head"] != row["candidate"]["head"] for row in rows),
        "current_heads": dict(Counter(d.head for _, d in recent)),
        "candidate_heads": dict(Counter(w.head for w in would)),
        "decisions": rows,
    }
