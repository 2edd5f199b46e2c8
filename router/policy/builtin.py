"""The vocabulary policies. Each maps (request, live state, routable heads) to a Choice.

The cost-based policies decide on two levels:

- **The regime** (which head typical traffic should use now): every head is compared under
  the live mix (`regime_mix`): the smoothed running batch per head plus the new request, with
  the regime head's traffic moved to the candidate and the groups the quality bound holds on
  larger heads left where they are (the steady state of a switch). A candidate whose
  rows nest inside a group that stays live shares that group's read (router.cost), so it is
  not priced as if it served the batch alone. Per served byte, with the manifest's
  bytes/token. Hysteresis, the minimum dwell and the flap cap hold this choice.
- **The request** (with `features: "request"`, when the gateway tokenized the prompt with
  every head): its marginal cost per output byte on each head under the live mix of head
  groups (router.cost.request_cost_per_byte), with its own predicted bytes/token, over the
  heads the quality bound leaves it. When another head is cheaper than the regime's head by
  more than the margin *for this request* (Russian on a 32k regime, or a request that would
  open a group of its own), the request goes there and the regime stays as it is: content
  is not a regime change, so no dwell or flap cap holds it back and it moves no held head.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from kernels.devices import DeviceSpec
from router.cost import (
    AnalyticTimer,
    Group,
    StepTimer,
    context_tokens,
    live_step_s,
    mix_cost_per_byte,
    request_cost_per_byte,
    train_cost_per_byte,
)
from router.ladder_outcomes import rung_shares, served_price
from router.policy.spec import CostParams, LifecycleParams, ThresholdParams, WeightedParams
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


LAMBDA_FLOOR = 1e-12  # λ below this is 0: no inference volume to amortize training over


def live_groups(snapshot: StateSnapshot, profiles: Sequence[HeadProfile],
                features: RequestFeatures) -> tuple[Group, ...]:
    """The head groups a new request joins: each head's running and queued requests now.
    Not the smoothed batch: that lags by its time constant, and a group opened a second ago
    already pays its V×d read every step. Mean contexts are not tracked, so each group is
    priced at this request's context on its head."""
    groups = []
    for p in profiles:
        b = snapshot.running.get(p.name, 0) + snapshot.waiting.get(p.name, 0)
        if b >= 1:
            groups.append(Group(p, b, context_tokens(p, features)))
    return tuple(groups)


def regime_mix(snapshot: StateSnapshot, profiles: Sequence[HeadProfile], head: HeadProfile,
               held: str | None, ctx: Mapping[str, float]) -> tuple[Group, ...]:
    """The steady state if the regime were `head`: the smoothed groups, rounded, with the new
    request, the held regime head's requests and those on heads no larger than `head` moved to
    `head`. Groups on larger heads stay: the quality bound only ever sends a request up, to a
    head nearer the native segmentation, so a regime switch would not move them. With no held
    head all of B goes to `head`. ctx: mean context per head, tokens."""
    shares = snapshot.smoothed_running or snapshot.running
    counts: dict[str, int] = {}
    moved = 1  # the new request
    for p in profiles:
        b = round(shares.get(p.name, 0))
        if held is None or p.name == held or p.vocab_size <= head.vocab_size:
            moved += b
        elif b >= 1:
            counts[p.name] = b
    counts[head.name] = counts.get(head.name, 0) + moved
    by_name = {p.name: p for p in profiles}
    return tuple(Group(by_name[n], b, ctx[n]) for n, b in counts.items())


def argmin(costs: Mapping[str, float]) -> str:
    return min(costs, key=costs.__getitem__)  # first head wins exact ties


def _table(costs: Mapping[str, float], unit: str) -> str:
    ranked = sorted(costs, key=costs.__getitem__)
    return " < ".join(f"{h} {costs[h]:.3g} {unit}" for h in ranked)


_HELD = {
    "hysteresis": "{best} is not {margin:.0%} cheaper (hysteresis",
    "dwell": "{best} is cheaper but {held} has not held {dwell:g} s (minimum dwell",
    "flap_cap": "{best} is cheaper but the cap of {cap} switches/min is reached (flap cap",
}


class CostPolicy:
    """argmin over heads of the inference cost per served byte (regime at live B; request
    at its marginal cost under the live mix, see the module header)."""

    name = "cost"
    unit = "s/B"

    def __init__(self, timer: StepTimer | DeviceSpec, params: CostParams | LifecycleParams,
                 clock: Clock = time.monotonic):
        self.timer = AnalyticTimer(timer) if isinstance(timer, DeviceSpec) else timer
        self.params = params
        self.stability = Stabilizer(params.min_dwell_s, params.max_switches_per_min, clock)

    def objective(self, head: HeadProfile, mix: Sequence[Group], lam: float) -> float:
        """The regime's price of `head`: device-s per served byte of its steady-state mix."""
        return mix_cost_per_byte(self.timer, mix)

    def request_objective(self, head: HeadProfile, features: RequestFeatures,
                          live: Sequence[Group], lam: float, before: float) -> float:
        """`before`: the live mix's step time (live_step_s), shared by every head priced."""
        return request_cost_per_byte(head, self.timer, live, features, before)

    def lam(self, snapshot: StateSnapshot) -> float:
        return snapshot.effective_lam()

    def decide(
        self, features: RequestFeatures, snapshot: StateSnapshot, profiles: Sequence[HeadProfile]
    ) -> Choice:
        lam, batch = self.lam(snapshot), live_batch(snapshot)
        ctx = {p.name: context_tokens(p, features) for p in profiles}
        held = self.stability.held
        regime = {p.name: self.objective(p, regime_mix(snapshot, profiles, p, held, ctx), lam)
                  for p in profiles}
        best = argmin(regime)
        margin = self.params.margin
        head, code = self.stability.choose(
            best, regime, lambda held: regime[best] < regime[held] * (1.0 - margin))
        where = f"B={batch}, λ={lam:.3g}"
        if code == "best":
            said = f"{self.name}: {head} cheapest at {where} ({_table(regime, self.unit)})"
        else:
            why = _HELD[code].format(best=best, held=head, margin=margin,
                                     dwell=self.params.min_dwell_s,
                                     cap=self.params.max_switches_per_min)
            said = f"{self.name}: kept {head} at {where}: {why}; {_table(regime, self.unit)})"
        if self.params.features == "blind" or not features.tokens:
            return Choice(head, said, code, regime)
        return self._for_request(features, snapshot, profiles, head, code, said, lam)

    def _for_request(self, features: RequestFeatures, snapshot: StateSnapshot,
                     profiles: Sequence[HeadProfile], regime_head: str, code: str, said: str,
                     lam: float) -> Choice:
        live = live_groups(snapshot, profiles, features)
        eligible = [p for p in profiles if p.name not in features.excluded] or list(profiles)
        before = live_step_s(self.timer, live)
        costs = {p.name: self.request_objective(p, features, live, lam, before)
                 for p in eligible}
        costs, moved = self._as_served(costs, features, snapshot, profiles, live, lam, before)
        mine = argmin(costs)
        table = _table(costs, self.unit) + moved
        mix = ", ".join(f"{g.head.name}×{g.batch}" for g in live) or "idle"
        keep = regime_head in costs and (
            mine == regime_head or costs[mine] >= costs[regime_head] * (1.0 - self.params.margin))
        if keep:
            return Choice(regime_head, f"{said}; this request: {table} (live mix {mix})", code,
                          costs)
        if regime_head not in costs:
            why, new_code = f"{regime_head} is past the quality bound", "quality_bound"
        else:
            why, new_code = f"{self.params.margin:.0%} cheaper for this request", "content"
        return Choice(mine, f"{self.name}: {mine} for this request ({why}; {table}; live mix "
                            f"{mix}); regime: {said}", new_code, costs)

    def _as_served(self, costs: dict[str, float], features: RequestFeatures,
                   snapshot: StateSnapshot, profiles: Sequence[HeadProfile],
                   live: Sequence[Group], lam: float, before: float
                   ) -> tuple[dict[str, float], str]:
        """Each laddered head's price as its requests of this class were served: blended
        over the rungs their bytes ended on (router.ladder_outcomes); -> (prices, a note)."""
        by_name = {p.name: p for p in profiles}

        def price(head: str) -> float | None:
            if head in costs:
                return costs[head]
            p = by_name.get(head)
            return None if p is None else self.request_objective(p, features, live, lam,
                                                                 before)

        out, notes = dict(costs), []
        for head in costs:
            shares = rung_shares(snapshot.ladders, head, features.script,
                                 features.bpb_penalty.get(head))
            served = served_price(head, shares, price) if len(shares) > 1 else None
            if served is not None:
                out[head] = served
                notes.append(f"{head} {1 - shares[head]:.0%}")
        return out, (f"; bytes moved up the ladder, priced: {', '.join(notes)}"
                     if notes else "")


class LifecyclePolicy(CostPolicy):
    """argmin over heads of C_lifecycle ÷ λ = C_infer + C_train ÷ λ: the cost per served byte
    with the training of each head whose cost is not sunk amortized over the λ it serves.

    For λ > 0 this ranks heads exactly as C_train + λ·C_infer does. A sunk head (trained or
    derived before it serves) adds no training term, so with every head sunk this is the
    cost policy. λ is floored at LAMBDA_FLOOR, so at λ = 0 heads still to be paid for rank
    by C_train (the limit λ → 0) behind every sunk head.
    """

    name = "lifecycle"
    params: LifecycleParams

    def __init__(self, timer: StepTimer | DeviceSpec, params: LifecycleParams,
                 clock: Clock = time.monotonic):
        super().__init__(timer, params, clock)

    def _train(self, head: HeadProfile, lam: float) -> float:
        if head.training_sunk:
            return 0.0
        return train_cost_per_byte(head, self.timer) / max(lam, LAMBDA_FLOOR)

    def objective(self, head: HeadProfile, mix: Sequence[Group], lam: float) -> float:
        return mix_cost_per_byte(self.timer, mix) + self._train(head, lam)

    def request_objective(self, head: HeadProfile, features: RequestFeatures,
                          live: Sequence[Group], lam: float, before: float) -> float:
        return request_cost_per_byte(head, self.timer, live, features, before) + \
            self._train(head, lam)

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
