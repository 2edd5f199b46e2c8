"""Admin API: read and switch the routing policy (bearer admin token)."""

from __future__ import annotations

import logging

from fastapi import APIRouter

from router.router import Router
from server.deps import AdminDep, MetricsDep, RouterDep
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
async def put_policy(doc: PolicyDocument, actor: AdminDep, r: RouterDep, m: MetricsDep) -> dict:
    before = policy_view(r)
    # Validated, then swapped atomically; requests already routed keep their head.
    version = r.set_policy(doc.model_dump(), actor)
    m.set_policy(doc.name, version, actor)
    log.info("policy changed by %s: %s v%s -> %s v%s", actor, before["name"],
             before["version"], doc.name, version)
    return policy_view(r)
