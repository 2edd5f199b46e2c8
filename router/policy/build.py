"""Building a policy from its spec: the built-in policy, wrapped in a quality guard when the
spec has one. Documents are parsed in router.policy.spec; the policies live in
router.policy.builtin.
"""

from __future__ import annotations

import logging
import time

from kernels.devices import DeviceSpec
from router.cost import AnalyticTimer, StepTimer
from router.policy.base import Policy
from router.policy.builtin import (
    CostPolicy,
    LifecyclePolicy,
    PinnedPolicy,
    ThresholdPolicy,
    WeightedPolicy,
)
from router.policy.guard import QualityGuard
from router.policy.spec import (
    CostParams,
    LifecycleParams,
    PinnedParams,
    PolicySpec,
    ThresholdParams,
)
from router.stability import Clock

log = logging.getLogger(__name__)


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
