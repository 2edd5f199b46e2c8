"""Policy documents: `{"name": ..., "params": {...}, "guard": {...}}`, validated strictly
into frozen specs; `guard` is optional (router.policy.guard wraps the policy in a quality guard).

Every switching policy shares the stability knobs (see router.stability): `margin`
(hysteresis), `min_dwell_s` and `max_switches_per_min` (0 = no cap). InvalidPolicy names
the bad field as a dotted path.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from router.errors import InvalidPolicy

log = logging.getLogger(__name__)

DEFAULT_MARGIN = 0.05
DEFAULT_DWELL_S = 2.0
DEFAULT_SWITCHES_PER_MIN = 10
# Most a request's predicted BPB may exceed its best head's (0.05: +5%), the margin within
# which a served head counts as the native head's quality. At 0.15 the demo's router sent a
# third of English prose to 32k, whose held-out English BPB is 1.34x native's.
DEFAULT_MAX_BPB_LOSS = 0.05
FEATURES = ("request", "blind")  # request-aware routing, or the manifest's averages only


@dataclass(frozen=True, slots=True)
class LifecycleParams:
    margin: float = DEFAULT_MARGIN  # relative cost gain needed to leave the held head
    lambda_override: float | None = None  # fixed λ instead of the live one (forecasts, tests)
    min_dwell_s: float = DEFAULT_DWELL_S
    max_switches_per_min: int = DEFAULT_SWITCHES_PER_MIN
    spill: bool = False  # over the KV limit, route to the next-cheapest head instead of 429
    features: str = "request"  # "blind": judge every request by the manifest's averages
    max_bpb_loss: float | None = DEFAULT_MAX_BPB_LOSS  # None: no per-request quality bound


@dataclass(frozen=True, slots=True)
class CostParams:
    margin: float = DEFAULT_MARGIN
    min_dwell_s: float = DEFAULT_DWELL_S
    max_switches_per_min: int = DEFAULT_SWITCHES_PER_MIN
    spill: bool = False
    features: str = "request"  # "blind": judge every request by the manifest's averages
    max_bpb_loss: float | None = DEFAULT_MAX_BPB_LOSS  # None: no per-request quality bound


@dataclass(frozen=True, slots=True)
class ThresholdParams:
    """The paper's rule: B > batch_high and λ > lambda_high -> large; B <= batch_low -> small;
    else mid. Heads default to the smallest, middle and largest vocabulary served."""

    batch_high: float = 64
    lambda_high: float = 10
    batch_low: float = 1
    small: str | None = None
    mid: str | None = None
    large: str | None = None
    margin: float = DEFAULT_MARGIN  # the live B and λ must clear the rule by this fraction
    min_dwell_s: float = DEFAULT_DWELL_S
    max_switches_per_min: int = DEFAULT_SWITCHES_PER_MIN
    spill: bool = False
    features: str = "request"  # "blind": judge every request by the manifest's averages
    max_bpb_loss: float | None = DEFAULT_MAX_BPB_LOSS  # None: no per-request quality bound


@dataclass(frozen=True, slots=True)
class PinnedParams:
    head: str


@dataclass(frozen=True, slots=True)
class WeightedParams:
    """A fixed traffic split (A/B tests). With min_dwell_s > 0 the split is served in runs of
    at least that long, so each head group stays batched."""

    weights: Mapping[str, float] = field(default_factory=dict)
    min_dwell_s: float = 0.0
    max_switches_per_min: int = 0
    spill: bool = False
    features: str = "request"  # "blind": judge every request by the manifest's averages
    max_bpb_loss: float | None = DEFAULT_MAX_BPB_LOSS  # None: no per-request quality bound


@dataclass(frozen=True, slots=True)
class GuardParams:
    """Quality guard: a head whose live prompt BPB exceeds its bound is excluded from routing
    until it is back below bound × (1 − margin). The bound is max_bpb, or the manifest's BPB
    × (1 + max_rel), the tighter where both are set; `bounds` sets max_bpb per head. A head
    without any bound is never excluded."""

    max_bpb: float | None = None  # absolute bound, bits per byte
    bounds: Mapping[str, float] = field(default_factory=dict)  # per-head max_bpb, overrides it
    max_rel: float | None = None  # relative bound over the head's manifest BPB (0.1: +10%)
    margin: float = DEFAULT_MARGIN  # readmit only this fraction inside the bound (hysteresis)
    min_samples: int = 3  # scored requests on a head before the guard judges it
    min_dwell_s: float = DEFAULT_DWELL_S  # a head stays excluded / readmitted at least this
    max_switches_per_min: int = DEFAULT_SWITCHES_PER_MIN  # per head, exclusions + readmissions


Params = LifecycleParams | CostParams | ThresholdParams | PinnedParams | WeightedParams

PARAMS: dict[str, type] = {
    "lifecycle": LifecycleParams,
    "cost": CostParams,
    "threshold": ThresholdParams,
    "pinned": PinnedParams,
    "weighted": WeightedParams,
}


@dataclass(frozen=True, slots=True)
class PolicySpec:
    name: str
    params: Params
    guard: GuardParams | None = None

    def to_doc(self) -> dict[str, Any]:
        params = {f.name: getattr(self.params, f.name) for f in dataclasses.fields(self.params)}
        if "weights" in params:
            params["weights"] = dict(params["weights"])
        doc: dict[str, Any] = {"name": self.name, "params": params}
        if self.guard is not None:
            doc["guard"] = dataclasses.asdict(self.guard)
        return doc


# ---------------------------------------------------------------- field validators


def _number(value: object, where: str, lo: float, hi: float = math.inf) -> float:
    # bool is an int subclass; "margin": true is a typo, not 1.0.
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InvalidPolicy(where, f"must be a finite number, got {value!r}")
    if not lo <= value < hi:
        raise InvalidPolicy(where, f"must be in [{lo}, {hi}), got {value!r}")
    return float(value)


def _head(value: object, where: str, heads: Sequence[str]) -> str:
    if not isinstance(value, str) or value not in heads:
        raise InvalidPolicy(where, f"unknown head {value!r} (known: {', '.join(heads)})")
    return value


def _field(name: str, value: object, heads: Sequence[str], section: str = "params") -> object:
    where = f"{section}.{name}"
    if name == "margin":
        return _number(value, where, 0.0, 1.0)
    if name in ("lambda_override", "small", "mid", "large", "max_bpb", "max_rel",
                "max_bpb_loss") and value is None:
        return None
    if name == "features":
        if value not in FEATURES:
            raise InvalidPolicy(where, f"must be one of {', '.join(FEATURES)}, got {value!r}")
        return value
    if name == "max_bpb":
        bound = _number(value, where, 0.0)
        if bound == 0:
            raise InvalidPolicy(where, "must be > 0")
        return bound
    if name in ("max_rel", "max_bpb_loss"):
        return _number(value, where, 0.0)
    if name in ("lambda_override", "lambda_high", "min_dwell_s"):
        return _number(value, where, 0.0)
    if name in ("batch_high", "batch_low"):
        return _number(value, where, 0.0)
    if name in ("max_switches_per_min", "min_samples"):
        n = _number(value, where, 0.0)
        if n != int(n):
            raise InvalidPolicy(where, f"must be an integer, got {value!r}")
        return int(n)
    if name == "spill":
        if not isinstance(value, bool):
            raise InvalidPolicy(where, f"must be true or false, got {value!r}")
        return value
    if name in ("head", "small", "mid", "large"):
        return _head(value, where, heads)
    if name == "bounds":
        if not isinstance(value, Mapping):
            raise InvalidPolicy(where, "must be an object head -> bits per byte")
        out = {_head(h, f"{where}.{h}", heads): _number(b, f"{where}.{h}", 0.0)
               for h, b in value.items()}
        if any(b == 0 for b in out.values()):
            raise InvalidPolicy(where, "every bound must be > 0")
        return out
    if name == "weights":
        if not isinstance(value, Mapping) or not value:
            raise InvalidPolicy(where, "must be a non-empty object head -> weight")
        weights = {_head(h, f"{where}.{h}", heads): _number(w, f"{where}.{h}", 0.0)
                   for h, w in value.items()}
        if sum(weights.values()) <= 0:
            raise InvalidPolicy(where, "at least one weight must be > 0")
        return weights
    raise AssertionError(name)


def _params(cls: type, values: object, heads: Sequence[str], section: str, owner: str) -> Any:
    if not isinstance(values, Mapping):
        raise InvalidPolicy(section, f"must be an object, got {type(values).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for key in values:
        if key not in fields:
            raise InvalidPolicy(f"{section}.{key}",
                                f"unknown parameter of {owner} (known: {', '.join(fields)})")
    for f in fields.values():
        required = (f.default is dataclasses.MISSING
                    and f.default_factory is dataclasses.MISSING)
        if required and f.name not in values:
            raise InvalidPolicy(f"{section}.{f.name}", "required")
    return cls(**{k: _field(k, v, heads, section) for k, v in values.items()})


def _guard(doc: object, name: str, heads: Sequence[str]) -> GuardParams | None:
    if doc is None:
        return None
    if name == "pinned":
        raise InvalidPolicy("guard", "a pinned policy has no other head to move traffic to")
    guard: GuardParams = _params(GuardParams, doc, heads, "guard", "guard")
    if guard.max_bpb is None and guard.max_rel is None and not guard.bounds:
        raise InvalidPolicy("guard", "set max_bpb, bounds or max_rel")
    return guard


def parse_policy(doc: object, heads: Sequence[str]) -> PolicySpec:
    """Validate `{"name": ..., "params": {...}, "guard": {...}}` strictly; InvalidPolicy names
    the bad field."""
    if not isinstance(doc, Mapping):
        raise InvalidPolicy("policy", f"must be an object, got {type(doc).__name__}")
    for key in doc:
        if key not in ("name", "params", "guard"):
            raise InvalidPolicy(str(key), "unknown field (known: name, params, guard)")
    name = doc.get("name")
    if name is None:
        raise InvalidPolicy("name", "required")
    if name not in PARAMS:
        raise InvalidPolicy("name", f"unknown policy {name!r} (known: {', '.join(PARAMS)})")
    params = _params(PARAMS[name], doc.get("params", {}), heads, "params", name)
    spec = PolicySpec(name, params, _guard(doc.get("guard"), name, heads))
    if isinstance(spec.params, WeightedParams) and not spec.params.weights:
        raise InvalidPolicy("params.weights", "required")
    return spec
