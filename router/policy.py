"""Vocabulary policies: the decision record, the Policy seam, and building a policy from a spec.

Documents are parsed in router.policy_spec; the policies live in router.policies.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from router.cost import AnalyticTimer, StepTimer
from router.devices import DeviceSpec
from router.guard import QualityGuard
from router.policies import (
    Choice,
    CostPolicy,
    LifecyclePolicy,
    PinnedPolicy,
    ThresholdPolicy,
    WeightedPolicy,
)
from router.policy_spec import (
    DEFAULT_MARGIN,
    CostParams,
    GuardParams,
    LifecycleParams,
    PinnedParams,
    PolicySpec,
    ThresholdParams,
    WeightedParams,
    parse_policy,
)
from router.profiles import HeadProfile, RequestFeatures
from router.stability import Clock
from router.state import StateSnapshot

log = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_MARGIN", "Choice", "CostParams", "CostPolicy", "Decision", "GuardParams",
    "LifecycleParams",
    "LifecyclePolicy", "PinnedParams", "PinnedPolicy", "Policy", "PolicySpec",
    "ThresholdParams", "ThresholdPolicy", "WeightedParams", "WeightedPolicy", "build_policy",
    "parse_policy",
]


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

    def to_record(self) -> dict[str, Any]:
        # An unpriceable head (a training cost not yet sunk, at λ = 0) is null in JSON.
        costs = {h: c if math.isfinite(c) else None for h, c in self.costs.items()}
        return {"at": self.at, "policy": self.policy, "version": self.version,
                "inputs": dict(self.inputs), "costs": costs, "head": self.head,
                "code": self.code, "reason": self.reason, "request": dict(self.request)}


class Policy(Protocol):
    @property
    def name(self) -> str: ...

    def decide(
        self, features: RequestFeatures, snapshot: StateSnapshot, profiles: Sequence[HeadProfile]
    ) -> Choice: ...


def build_policy(
    spec: PolicySpec, timer: DeviceSpec | StepTimer, clock: Clock = time.monotonic
) -> Policy:
    """A fresh policy instance: its stability state starts empty with each new version."""
    inner = _build_inner(spec, timer, clock)
    if spec.guard is None:
        return inner
    return QualityGuard(inner, spec.guard, clock)


def _build_inner(spec: PolicySpec, timer: DeviceSpec | StepTimer, clock: Clock) -> Policy:
    t: StepTimer = AnalyticTimer(timer) if isinstance(timer, DeviceSpec) else timer
    p = spec.params
    if isinstance(p, PinnedParams):
        return PinnedPolicy(p.head)
    if isinstance(p, LifecycleParams):
        return LifecyclePolicy(t, p, clock)
    if isinstance(p, CostParams):
        return CostPolicy(t, p, clock)
    if isinstance(p, ThresholdParams):
        return ThresholdPolicy(p, clock)
    return WeightedPolicy(p, clock)


def inputs_of(snapshot: StateSnapshot, batch: int) -> Mapping[str, float]:
    return {"batch": batch, "batch_raw": snapshot.batch,
            "batch_smoothed": round(snapshot.smoothed_batch, 3),
            "lambda": snapshot.effective_lam(), "lambda_measured": snapshot.lam(),
            "queue": snapshot.queue}
