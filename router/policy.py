"""Vocabulary policies: parse a policy document, then pick a head per request, with a reason."""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from router.cost import context_tokens, lifecycle_cost
from router.devices import DeviceSpec
from router.errors import InvalidPolicy
from router.profiles import HeadProfile, RequestFeatures
from router.state import StateSnapshot

log = logging.getLogger(__name__)

DEFAULT_MARGIN = 0.05


@dataclass(frozen=True, slots=True)
class Decision:
    head: str
    policy: str  # the policy that chose; "request_pin" when the request named its head
    version: int  # policy version in force
    reason: str
    costs: dict[str, float] = field(default_factory=dict)  # head -> cost the policy compared


class Policy(Protocol):
    @property
    def name(self) -> str: ...

    def decide(
        self, features: RequestFeatures, snapshot: StateSnapshot, profiles: Sequence[HeadProfile]
    ) -> tuple[str, str, dict[str, float]]: ...


@dataclass(frozen=True, slots=True)
class LifecycleParams:
    margin: float = DEFAULT_MARGIN  # relative cost gain needed to leave the preferred head
    lambda_override: float | None = None  # fixed λ instead of the live one (forecasts, tests)


@dataclass(frozen=True, slots=True)
class PinnedParams:
    head: str


@dataclass(frozen=True, slots=True)
class PolicySpec:
    name: str
    params: LifecycleParams | PinnedParams

    def to_doc(self) -> dict[str, Any]:
        if isinstance(self.params, PinnedParams):
            return {"name": self.name, "params": {"head": self.params.head}}
        p = self.params
        return {
            "name": self.name,
            "params": {"margin": p.margin, "lambda_override": p.lambda_override},
        }


# ---------------------------------------------------------------- parsing


def _number(value: object, where: str, lo: float, hi: float = math.inf) -> float:
    # bool is an int subclass; "margin": true is a typo, not 1.0.
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InvalidPolicy(where, f"must be a finite number, got {value!r}")
    if not lo <= value < hi:
        raise InvalidPolicy(where, f"must be in [{lo}, {hi}), got {value!r}")
    return float(value)


def _lifecycle_params(params: Mapping[str, object]) -> LifecycleParams:
    margin = _number(params.get("margin", DEFAULT_MARGIN), "params.margin", 0.0, 1.0)
    raw = params.get("lambda_override")
    lam = None if raw is None else _number(raw, "params.lambda_override", 0.0)
    return LifecycleParams(margin=margin, lambda_override=lam)


def _pinned_params(params: Mapping[str, object], heads: Sequence[str]) -> PinnedParams:
    if "head" not in params:
        raise InvalidPolicy("params.head", "required")
    head = params["head"]
    if not isinstance(head, str) or head not in heads:
        raise InvalidPolicy("params.head", f"unknown head {head!r} (known: {', '.join(heads)})")
    return PinnedParams(head=head)


_PARAM_KEYS = {"lifecycle": ("margin", "lambda_override"), "pinned": ("head",)}


def parse_policy(doc: object, heads: Sequence[str]) -> PolicySpec:
    """Validate `{"name": ..., "params": {...}}` strictly; InvalidPolicy names the bad field."""
    if not isinstance(doc, Mapping):
        raise InvalidPolicy("policy", f"must be an object, got {type(doc).__name__}")
    for key in doc:
        if key not in ("name", "params"):
            raise InvalidPolicy(str(key), "unknown field (known: name, params)")
    name = doc.get("name")
    if name is None:
        raise InvalidPolicy("name", "required")
    if name not in _PARAM_KEYS:
        raise InvalidPolicy("name", f"unknown policy {name!r} (known: {', '.join(_PARAM_KEYS)})")
    params = doc.get("params", {})
    if not isinstance(params, Mapping):
        raise InvalidPolicy("params", f"must be an object, got {type(params).__name__}")
    for key in params:
        if key not in _PARAM_KEYS[name]:
            known = ", ".join(_PARAM_KEYS[name])
            raise InvalidPolicy(f"params.{key}", f"unknown parameter of {name} (known: {known})")
    if name == "pinned":
        return PolicySpec(name, _pinned_params(params, heads))
    return PolicySpec(name, _lifecycle_params(params))


# ---------------------------------------------------------------- policies


@dataclass(frozen=True, slots=True)
class PinnedPolicy:
    head: str
    name: str = "pinned"

    def decide(
        self, features: RequestFeatures, snapshot: StateSnapshot, profiles: Sequence[HeadProfile]
    ) -> tuple[str, str, dict[str, float]]:
        return self.head, f"pinned: the policy pins every request to {self.head}", {}


class LifecyclePolicy:
    """argmin over heads of C_lifecycle at B = that head's running count + 1 and the live λ.

    Hysteresis: the preferred head changes only when another is cheaper by `margin` (relative),
    so small cost wobbles near a crossover do not flip traffic between heads.
    """

    name = "lifecycle"

    def __init__(self, device: DeviceSpec, params: LifecycleParams | None = None) -> None:
        self.device = device
        self.params = params or LifecycleParams()
        self._lock = threading.Lock()  # guards the preferred head across request threads
        self._preferred: str | None = None

    def decide(
        self, features: RequestFeatures, snapshot: StateSnapshot, profiles: Sequence[HeadProfile]
    ) -> tuple[str, str, dict[str, float]]:
        lam = self.params.lambda_override
        lam = snapshot.lam() if lam is None else lam
        batch = {p.name: snapshot.running.get(p.name, 0) + 1 for p in profiles}
        costs = {
            p.name: lifecycle_cost(
                p, self.device, batch[p.name], lam, context_tokens(p, features)
            ).total
            for p in profiles
        }
        best = min(costs, key=costs.__getitem__)  # first head wins exact ties
        with self._lock:
            held = self._preferred if self._preferred in costs else None
            switch = held is None or costs[best] < costs[held] * (1.0 - self.params.margin)
            if switch:
                self._preferred = best
            head = best if switch else held
        assert head is not None
        return head, self._reason(head, best, costs, batch[head], lam), costs

    def _reason(self, head: str, best: str, costs: dict[str, float], batch: int, lam: float) -> str:
        ranked = sorted(costs, key=costs.__getitem__)
        table = " < ".join(f"{h} {costs[h]:.3g} s/B" for h in ranked)
        if head == best:
            return f"lifecycle: {head} cheapest at B={batch}, λ={lam:.3g} ({table})"
        pct = f"{self.params.margin:.0%}"
        return (
            f"lifecycle: kept {head} at B={batch}, λ={lam:.3g}: {best} is not {pct} cheaper "
            f"(hysteresis; {table})"
        )


def build_policy(spec: PolicySpec, device: DeviceSpec) -> Policy:
    if isinstance(spec.params, PinnedParams):
        return PinnedPolicy(spec.params.head)
    return LifecyclePolicy(device, spec.params)
