"""The decision record and the Policy seam every vocabulary policy implements."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from router.policy.builtin import Choice
from router.profiles import HeadProfile, RequestFeatures
from router.state import StateSnapshot


@dataclass(frozen=True, slots=True)
class Decision:
    """One routing decision, explainable on its own (GET /admin/decisions)."""

    head: str
    policy: str  # the policy that chose; "request_pin" when the request named its head
    version: int  # policy version in force
    reason: str
    costs: dict[str, float] = field(default_factory=dict)  # head -> cost the policy compared
    code: str = "best"  # bounded reason label, router.stability.REASON_CODES
    inputs: Mapping[str, float] = field(default_factory=dict)  # B, λ, queue at decision time
    at: float = 0.0  # Unix time, s
    request: Mapping[str, Any] = field(default_factory=dict)  # router.router.request_record
    # Heads of one native token stream the engine may move the request up, cheapest first,
    # `head` first and the native head last, judged by measured loss against the policy's
    # quality bound (heads.engine.quality_control); empty: the request stays on `head`.
    ladder: tuple[str, ...] = ()
    # Exact drafting (heads.engine.drafting): the reading that drafts for `head`, the native
    # head, which verifies every token; None: no drafting.
    drafter: str | None = None
    # Whether the engine measures the prompt of a laddered request (False: its class stayed
    # put on `head`, router.ladder_outcomes.stays_put, and the decode probes alone guard it).
    measure_prompt: bool = True

    def to_record(self) -> dict[str, Any]:
        # An unpriceable head (a training cost not yet sunk, at λ = 0) is null in JSON.
        costs = {h: c if math.isfinite(c) else None for h, c in self.costs.items()}
        return {"at": self.at, "policy": self.policy, "version": self.version,
                "inputs": dict(self.inputs), "costs": costs, "head": self.head,
                "code": self.code, "reason": self.reason, "request": dict(self.request),
                "ladder": list(self.ladder), "drafter": self.drafter,
                "measure_prompt": self.measure_prompt}


class Policy(Protocol):
    @property
    def name(self) -> str: ...

    def decide(
        self, features: RequestFeatures, snapshot: StateSnapshot, profiles: Sequence[HeadProfile]
    ) -> Choice: ...


def inputs_of(snapshot: StateSnapshot, batch: int) -> Mapping[str, float]:
    return {"batch": batch, "batch_raw": snapshot.batch,
            "batch_smoothed": round(snapshot.smoothed_batch, 3),
            "lambda": snapshot.effective_lam(), "lambda_measured": snapshot.lam(),
            "queue": snapshot.queue}
