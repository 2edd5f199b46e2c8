"""The vocabulary policies. Each maps (request, live state, routable heads) to a Choice.

Live B for a candidate head is the smoothed running batch of the whole engine plus the new
request: if traffic moves to that head, that is the group it will be serving, so every head
is compared at the same B (the steady state of a switch), not at its own current group.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from router.cost import (
    AnalyticTimer,
    StepTimer,
    context_tokens,
    infer_cost_per_byte,
    lifecycle_cost,
)
from router.devices import DeviceSpec
from router.policy_spec import (
    CostParams,
    LifecycleParams,
    ThresholdParams,
    WeightedParams,
)
from router.profiles import HeadProfile, RequestFeatures
from router.stability import Clock, Stabilizer
from router.state import StateSnapshot

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Choice:
    head: str
    reason: str
    code: str  # one of router.stability.REASON_CODES
    costs: dict[str, float] = field(default_factory=dict)  # head -> what the policy compared


def live_batch(snapshot: StateSnapshot) -> int:
    """B a new request joins: the smoothed running batch, rounded, plus itself."""
    return round(snapshot.smoothed_batch) + 1


def _table(costs: Mapping[str, float], unit: str) -> str:
    ranked = sorted(costs, key=costs.__getitem__)
    return " < ".join(f"{h} {costs[h]:.3g} {unit}" for h in ranked)


_HELD = {
    "hysteresis": "{best} is not {margin:.0%} cheaper (hysteresis",
    "dwell": "{best} is cheaper but {held} has not held {dwell:g} s (minimum dwell",
    "flap_cap": "{best} is cheaper but the cap of {cap} switches/min is reached (flap cap",
}


class CostPolicy:
    """argmin over heads of the inference cost per served byte, at live B."""

    name = "cost"
    unit = "s/B"

    def __init__(self, timer: StepTimer | DeviceSpec, params: CostParams | LifecycleParams,
                 clock: Clock = time.monotonic):
        self.timer = AnalyticTimer(timer) if isinstance(timer, DeviceSpec) else timer
        self.params = params
        self.stability = Stabilizer(params.min_dwell_s, params.max_switches_per_min, clock)

    def objective(self, head: HeadProfile, batch: int, lam: float, ctx: float) -> float:
        return infer_cost_per_byte(head, self.timer, batch, ctx)

    def lam(self, snapshot: StateSnapshot) -> float:
        return snapshot.effective_lam()

    def decide(
        self, features: RequestFeatures, snapshot: StateSnapshot, profiles: Sequence[HeadProfile]
    ) -> Choice:
        lam, batch = self.lam(snapshot), live_batch(snapshot)
        costs = {p.name: self.objective(p, batch, lam, context_tokens(p, features))
                 for p in profiles}
        best = min(costs, key=costs.__getitem__)  # first head wins exact ties
        margin = self.params.margin
        head, code = self.stability.choose(
            best, costs, lambda held: costs[best] < costs[held] * (1.0 - margin))
        where = f"B={batch}, λ={lam:.3g}"
        table = _table(costs, self.unit)
        if code == "best":
            return Choice(head, f"{self.name}: {head} cheapest at {where} ({table})", code, costs)
        why = _HELD[code].format(best=best, held=head, margin=margin,
                                 dwell=self.params.min_dwell_s,
                                 cap=self.params.max_switches_per_min)
        return Choice(head, f"{self.name}: kept {head} at {where}: {why}; {table})", code, costs)


class LifecyclePolicy(CostPolicy):
    """argmin over heads of C_lifecycle = C_train + λ·C_infer at live B and λ."""

    name = "lifecycle"
    params: LifecycleParams

    def __init__(self, timer: StepTimer | DeviceSpec, params: LifecycleParams,
                 clock: Clock = time.monotonic):
        super().__init__(timer, params, clock)

    def objective(self, head: HeadProfile, batch: int, lam: float, ctx: float) -> float:
        return lifecycle_cost(head, self.timer, batch, lam, ctx).total

    def lam(self, snapshot: StateSnapshot) -> float:
        override = self.params.lambda_override
        return snapshot.effective_lam() if override is None else override


class ThresholdPolicy:
    """The paper's rule table; hysteresis: the rule must give the same head at B and λ moved
    by ±margin, so a value sitting on a threshold does not flip traffic."""

    name = "threshold"

    def __init__(self, params: ThresholdParams, clock: Clock = time.monotonic) -> None:
        self.params = params
        self.stability = Stabilizer(params.min_dwell_s, params.max_switches_per_min, clock)

    def _heads(self, profiles: Sequence[HeadProfile]) -> tuple[str, str, str]:
        by_v = sorted(profiles, key=lambda p: p.vocab_size)
        names = {p.name for p in profiles}

        def pick(want: str | None, default: HeadProfile) -> str:
            return want if want in names else default.name

        p = self.params
        return (pick(p.small, by_v[0]), pick(p.mid, by_v[len(by_v) // 2]),
                pick(p.large, by_v[-1]))

    def rule(self, batch: float, lam: float, heads: tuple[str, str, str]) -> str:
        b, p = round(batch), self.params
        if b > p.batch_high and lam > p.lambda_high:
            return heads[2]
        if b <= p.batch_low:
            return heads[0]
        return heads[1]

    def decide(
        self, features: RequestFeatures, snapshot: StateSnapshot, profiles: Sequence[HeadProfile]
    ) -> Choice:
        heads = self._heads(profiles)
        batch, lam, m = live_batch(snapshot), snapshot.effective_lam(), self.params.margin
        best = self.rule(batch, lam, heads)
        band = {self.rule(batch * fb, lam * fl, heads)
                for fb in (1 - m, 1 + m) for fl in (1 - m, 1 + m)}
        head, code = self.stability.choose(best, {p.name for p in profiles},
                                           lambda held: band == {best})
        where = f"B={batch}, λ={lam:.3g}"
        p = self.params
        rule = f"B>{p.batch_high:g} & λ>{p.lambda_high:g} → {heads[2]}; " \
               f"B≤{p.batch_low:g} → {heads[0]}; else {heads[1]}"
        if code == "best":
            return Choice(head, f"threshold: {head} by rule at {where} ({rule})", code)
        return Choice(head, f"threshold: kept {head} at {where}: rule says {best} ({code}; "
                            f"{rule})", code)


@dataclass(frozen=True, slots=True)
class PinnedPolicy:
    head: str
    name: str = "pinned"

    def decide(
        self, features: RequestFeatures, snapshot: StateSnapshot, profiles: Sequence[HeadProfile]
    ) -> Choice:
        return Choice(self.head, f"pinned: the policy pins every request to {self.head}",
                      "pinned")


class WeightedPolicy:
    """A fixed split: the head furthest below its share of requests served so far is next
    (smooth weighted round robin), moving only when dwell and the switch cap allow."""

    name = "weighted"

    def __init__(self, params: WeightedParams, clock: Clock = time.monotonic) -> None:
        self.params = params
        self.stability = Stabilizer(params.min_dwell_s, params.max_switches_per_min, clock)
        self._served: dict[str, int] = dict.fromkeys(params.weights, 0)
        self._lock = threading.Lock()

    def decide(
        self, features: RequestFeatures, snapshot: StateSnapshot, profiles: Sequence[HeadProfile]
    ) -> Choice:
        names = {p.name for p in profiles}
        weights = {h: w for h, w in self.params.weights.items() if h in names and w > 0}
        if not weights:  # every weighted head is drained: spread over what is left
            weights = dict.fromkeys(names, 1.0)
        total_w = sum(weights.values())
        with self._lock:
            total_n = sum(self._served.get(h, 0) for h in weights)
            deficit = {h: w / total_w * (total_n + 1) - self._served.get(h, 0)
                       for h, w in weights.items()}
            best = max(deficit, key=deficit.__getitem__)
            head, code = self.stability.choose(best, weights, lambda held: True)
            self._served[head] = self._served.get(head, 0) + 1
        share = ", ".join(f"{h} {w / total_w:.0%}" for h, w in weights.items())
        return Choice(head, f"weighted: {head} for a split of {share}",
                      "weighted" if code == "best" else code)
