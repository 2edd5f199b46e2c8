"""Admin API: read and switch the routing policy (bearer admin token)."""

from __future__ import annotations

import logging

from fastapi import APIRouter, Header, Query, Request

from router.router import Router
from server.deps import AdminDep, AuditDep, MetricsDep, RouterDep
from server.policy_ops import dry_run_report, parse_if_match, persist_policy
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
