"""The router: one decision per request under the active policy, which can be swapped live."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from router.devices import DeviceSpec
from router.errors import RouterError, UnknownHead
from router.policy import Decision, Policy, PolicySpec, build_policy, parse_policy
from router.profiles import HeadProfile, RequestFeatures
from router.state import LiveState

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class _Active:
    # Swapped as one reference, so a reader never sees a policy with another's version.
    spec: PolicySpec
    policy: Policy
    version: int
    changed_by: str
    changed_at: float  # Unix time, s


class Router:
    def __init__(
        self,
        profiles: Sequence[HeadProfile],
        device: DeviceSpec,
        state: LiveState,
        policy_doc: Mapping[str, Any],
    ) -> None:
        names = [p.name for p in profiles]
        if not names:
            raise RouterError("at least one head profile is required")
        if len(set(names)) != len(names):
            raise RouterError(f"duplicate head names in {names}")
        if set(state.heads) != set(names):
            raise RouterError(f"live state tracks {list(state.heads)}, profiles are {names}")
        self.profiles = tuple(profiles)
        self.device = device
        self.state = state
        self._heads = tuple(names)
        self._lock = threading.Lock()  # serializes writers; readers take self._active as is
        spec = parse_policy(policy_doc, self._heads)
        self._active = _Active(spec, build_policy(spec, device), 1, "startup", time.time())

    @property
    def heads(self) -> tuple[str, ...]:
        return self._heads

    @property
    def policy_doc(self) -> dict[str, Any]:
        return self._active.spec.to_doc()

    @property
    def version(self) -> int:
        return self._active.version

    @property
    def changed_by(self) -> str:
        return self._active.changed_by

    @property
    def changed_at(self) -> float:
        return self._active.changed_at

    def set_policy(self, doc: Mapping[str, Any], actor: str) -> int:
        """Validate, then swap in the new policy atomically; returns the new version."""
        spec = parse_policy(doc, self._heads)  # raises InvalidPolicy; nothing changes then
        policy = build_policy(spec, self.device)
        with self._lock:
            version = self._active.version + 1
            self._active = _Active(spec, policy, version, actor, time.time())
        log.info("policy v%d set by %s: %s", version, actor, spec.to_doc())
        return version

    def decide(self, features: RequestFeatures) -> Decision:
        active = self._active
        if features.pinned_head is not None:
            if features.pinned_head not in self._heads:
                raise UnknownHead(features.pinned_head, self._heads)
            reason = (
                f"request pinned {features.pinned_head}; overrides the {active.spec.name} policy"
            )
            return Decision(features.pinned_head, "request_pin", active.version, reason, {})
        head, reason, costs = active.policy.decide(features, self.state.snapshot(), self.profiles)
        return Decision(head, active.spec.name, active.version, reason, costs)
