"""Helpers of the policy admin routes: If-Match parsing, the dry-run report, persistence."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from typing import Any

from fastapi import Request

from router.errors import VersionConflict
from router.router import Router
from router.store import PolicySync
from server.errors import BadRequest

log = logging.getLogger(__name__)


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
