"""Lifecycle costs per candidate V, the optimal V, and closed-form break-even λ.

Per candidate the cost is a line in λ (device-seconds per training byte):

    C(V, λ) = T(V) + λ·I(V),   T = C_train / mfu,   I = Σ_r share_r · C_infer(V, B_r, ctx_r)

With V0 the training optimum (argmin T), V overtakes V0 above
λ* = (T(V) − T(V0)) ÷ (I(V0) − I(V)) when I(V) < I(V0), and never (∞) otherwise.
Each regime is also planned alone, as if it carried all the traffic.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass

from router.cost import context_tokens, infer_cost_per_byte, train_cost_per_byte
from router.planner.forecast import Candidate, Forecast, Regime
from router.profiles import HeadProfile, RequestFeatures

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Line:
    vocab_size: int
    train: float  # T: device-s per training byte
    infer: float  # I: device-s per served byte

    def at(self, lam: float) -> float:
        return self.train + lam * self.infer


def break_even(line: Line, base: Line) -> float:
    """λ above which `line` is cheaper than `base`; 0 if it always is, inf if it never is."""
    d_infer, d_train = base.infer - line.infer, line.train - base.train
    if d_infer > 0:
        return max(0.0, d_train / d_infer)
    return 0.0 if d_train < 0 else math.inf


@dataclass(frozen=True, slots=True)
class ScopePlan:
    """The whole mix, or one regime alone."""

    name: str
    share: float
    lines: tuple[Line, ...]
    lam: float

    def optimal_at(self, lam: float) -> Line:
        return self.optimal_among(self.lines, lam)

    def optimal_among(self, lines: Sequence[Line], lam: float | None = None) -> Line:
        # Ties go to the cheaper-to-serve head, then the smaller V.
        at = self.lam if lam is None else lam
        return min(lines, key=lambda ln: (ln.at(at), ln.infer, ln.vocab_size))

    @property
    def optimal(self) -> Line:
        return self.optimal_at(self.lam)

    @property
    def train_optimal(self) -> Line:
        return self.optimal_at(0.0)

    def break_evens(self) -> dict[int, float]:
        base = self.train_optimal
        return {ln.vocab_size: break_even(ln, base) for ln in self.lines}

    def envelope(self) -> list[tuple[float, float, int]]:
        """(λ from, λ to, V): which candidate is optimal over each interval of λ."""
        out: list[tuple[float, float, int]] = []
        cur, start = self.train_optimal, 0.0
        while True:
            nxt = [(break_even(ln, cur), ln) for ln in self.lines if ln.infer < cur.infer]
            if not nxt:
                out.append((start, math.inf, cur.vocab_size))
                return out
            lam, line = min(nxt, key=lambda t: (t[0], t[1].infer))
            lam = max(lam, start)
            if lam > start:
                out.append((start, lam, cur.vocab_size))
            cur, start = line, lam


@dataclass(frozen=True, slots=True)
class VocabPlan:
    forecast: Forecast
    mix: ScopePlan
    regimes: tuple[ScopePlan, ...]

    @property
    def scopes(self) -> tuple[ScopePlan, ...]:
        return (self.mix, *self.regimes)


def heads(forecast: Forecast) -> list[HeadProfile]:
    bb = forecast.backbone
    return [HeadProfile(f"V{c.vocab_size}", c.vocab_size, bb.hidden_size, bb.backbone_params,
                        bb.kv_bytes_per_token, bb.weight_bytes_per_param,
                        bytes_per_token=c.bytes_per_token) for c in forecast.candidates]


def regime_infer(head: HeadProfile, regime: Regime, forecast: Forecast) -> float:
    out_tokens = (regime.output_tokens if regime.output_tokens is not None
                  else round((regime.output_bytes or 0) / head.bpt))
    ctx = context_tokens(head, RequestFeatures(regime.prompt_bytes, out_tokens))
    return infer_cost_per_byte(head, forecast.device, regime.batch, ctx)


def _scope(name: str, share: float, hs: Sequence[HeadProfile], train: Sequence[float],
           infer: Sequence[float], lam: float) -> ScopePlan:
    lines = tuple(Line(h.vocab_size, t, i) for h, t, i in zip(hs, train, infer, strict=True))
    return ScopePlan(name, share, lines, lam)


def plan(forecast: Forecast) -> VocabPlan:
    hs = heads(forecast)
    train = [train_cost_per_byte(h, forecast.device) / forecast.mfu for h in hs]
    per_regime = [[regime_infer(h, r, forecast) for h in hs] for r in forecast.regimes]
    mixed = [sum(r.share * per_regime[k][j] for k, r in enumerate(forecast.regimes))
             for j in range(len(hs))]
    result = VocabPlan(
        forecast,
        _scope("mix", 1.0, hs, train, mixed, forecast.lam),
        tuple(_scope(r.name, r.share, hs, train, per_regime[k], forecast.lam)
              for k, r in enumerate(forecast.regimes)),
    )
    log.debug("plan %s: optimal V=%d at λ=%g", forecast.name, result.mix.optimal.vocab_size,
              forecast.lam)
    return result


def _lam(x: float) -> float | None:
    return None if math.isinf(x) else x  # JSON has no ∞: null means never


def candidate_json(c: Candidate) -> dict[str, object]:
    return {"vocab_size": c.vocab_size, "bytes_per_token": c.bytes_per_token,
            "bytes_per_token_source": c.source}


# The unit of every figure a plan's JSON holds; the time figures also carry theirs in the name.
UNITS = {
    "lambda": "served bytes per training byte",
    "break_even_lambda": "served bytes per training byte (null: never)",
    "optimal_by_lambda": "served bytes per training byte (from, to)",
    "sweep": "served bytes per training byte -> vocab_size",
    "share": "fraction of served bytes",
    "training_bytes": "bytes",
    "mfu": "fraction of the device's peak FLOP/s a training run reaches",
    "train_device_s_per_training_byte": "seconds of one device per training byte",
    "infer_device_s_per_served_byte": "seconds of one device per served byte",
    "lifecycle_device_s_per_training_byte": "seconds of one device per training byte, "
                                            "training plus lambda x serving",
    "train_device_hours": "hours of one device to train on training_bytes",
    "serve_device_hours": "hours of one device to serve lambda x training_bytes",
    "lifecycle_device_hours": "train_device_hours + serve_device_hours",
}


def _hours(s_per_byte: float, training_bytes: float | None) -> float | None:
    return None if training_bytes is None else s_per_byte * training_bytes / 3600


def scope_json(s: ScopePlan, training_bytes: float | None, sweep: Sequence[float]) -> dict:
    evens = s.break_evens()
    return {
        "name": s.name, "share": s.share, "lambda": s.lam,
        "optimal_vocab": s.optimal.vocab_size,
        "training_optimal_vocab": s.train_optimal.vocab_size,
        "candidates": [{
            "vocab_size": ln.vocab_size, "train_device_s_per_training_byte": ln.train,
            "infer_device_s_per_served_byte": ln.infer,
            "lifecycle_device_s_per_training_byte": ln.at(s.lam),
            "train_device_hours": _hours(ln.train, training_bytes),
            "serve_device_hours": _hours(s.lam * ln.infer, training_bytes),
            "lifecycle_device_hours": _hours(ln.at(s.lam), training_bytes),
            "break_even_lambda": _lam(evens[ln.vocab_size]),
        } for ln in s.lines],
        "optimal_by_lambda": [{"from": a, "to": _lam(b), "vocab_size": v}
                              for a, b, v in s.envelope()],
        "sweep": {str(lam): s.optimal_at(lam).vocab_size for lam in sweep},
    }


def plan_json(p: VocabPlan) -> dict:
    f = p.forecast
    return {
        "forecast": f.name, "device": f.device.name, "lambda": f.lam,
        "training_bytes": f.training_bytes, "mfu": f.mfu, "units": UNITS,
        "candidates": [candidate_json(c) for c in f.candidates],
        "mix": scope_json(p.mix, f.training_bytes, f.sweep),
        "regimes": [scope_json(s, f.training_bytes, f.sweep) for s in p.regimes],
    }
