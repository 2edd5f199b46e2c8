"""The planner fed by live traffic: which V is lifecycle-optimal for the B the gateway has
seen and the λ it has served, and each head's break-even λ against the training optimum.

The heads already exist, so their training is sunk for routing; this answers the planning
question instead: had the backbone been trained with vocabulary V, what would the traffic
so far cost? The B distribution is the live batch at each of the router's recent decisions
(equal weight per request), the context is each request's own; costs use the router's
timer, so a calibrated gateway plans with measured step times.

Beside that unconstrained optimum stands the optimum within the active policy's quality
bound (`max_bpb_loss`), the bound the router applies to each request: among the candidates
the bound admits for the most recent requests (every one, when a candidate admits them all),
the cheapest. Device-hours are hours of the gateway's own device (the router's timer), at
`mfu` for training: on a CPU gateway, training figures are large by design.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from router.cost import StepTimer, context_tokens, infer_cost_per_byte, train_cost_per_byte
from router.planner.plan import UNITS, Line, ScopePlan, scope_json
from router.profiles import HeadProfile, RequestFeatures
from router.segmentation import excluded_by_bound

log = logging.getLogger(__name__)

DEFAULT_MFU = 0.4  # a real training run's fraction of peak FLOP/s (the planner's default)


def live_scope(profiles: Sequence[HeadProfile], timer: StepTimer,
               recent: Sequence[tuple[RequestFeatures, int]], lam: float,
               mfu: float = DEFAULT_MFU) -> ScopePlan:
    """`recent`: (request, live B at its decision); with none, one request at B=1."""
    seen = list(recent) or [(RequestFeatures(1024, 256), 1)]
    lines = []
    for p in profiles:
        infer = sum(infer_cost_per_byte(p, timer, max(1, b), context_tokens(p, f))
                    for f, b in seen) / len(seen)
        lines.append(Line(p.vocab_size, train_cost_per_byte(p, timer) / mfu, infer))
    return ScopePlan("live", 1.0, tuple(lines), lam)


def within_bound(profiles: Sequence[HeadProfile], recent: Sequence[RequestFeatures],
                 bound: float | None) -> tuple[int, dict[str, float]]:
    """(requests the bound judged, per head the share of them it admits). A request is judged
    when the router predicted its per-head BPB penalty (request-aware and not pinned)."""
    judged = [f.bpb_penalty for f in recent if f.bpb_penalty]
    admitted = dict.fromkeys((p.name for p in profiles), 0)
    for penalty in judged:
        out = excluded_by_bound(penalty, bound)
        for head in admitted:
            admitted[head] += head not in out
    return len(judged), {h: n / len(judged) if judged else 1.0 for h, n in admitted.items()}


def bounded_optimal(scope: ScopePlan, shares: dict[int, float]) -> Line:
    """The cheapest candidate among those the bound admits for the most requests."""
    most = max(shares.values())
    return scope.optimal_among([ln for ln in scope.lines if shares[ln.vocab_size] >= most])


def live_plan_json(profiles: Sequence[HeadProfile], timer: StepTimer,
                   recent: Sequence[tuple[RequestFeatures, int]], lam: float,
                   training_bytes: float | None, mfu: float = DEFAULT_MFU,
                   policy: str | None = None, bound: float | None = None) -> dict[str, Any]:
    """`policy`, `bound`: the active policy's name and quality bound (max_bpb_loss)."""
    scope = live_scope(profiles, timer, recent, lam, mfu)
    batches = sorted(b for _, b in recent)
    names = {p.vocab_size: p.name for p in profiles}
    judged, shares = within_bound(profiles, [f for f, _ in recent], bound)
    doc = scope_json(scope, training_bytes, (0.0, 0.1, 1.0, 10.0, 100.0))
    for c in doc["candidates"]:
        c["head"] = names[c["vocab_size"]]
        c["within_bound_share"] = shares[c["head"]]
    bounded = bounded_optimal(scope, {p.vocab_size: shares[p.name] for p in profiles})
    return {
        "requests": len(recent), "device": timer.device.name, "mfu": mfu,
        "training_bytes": training_bytes,
        "batch": {"p50": batches[len(batches) // 2] if batches else None,
                  "max": batches[-1] if batches else None},
        **doc,
        "optimal_head": names[scope.optimal.vocab_size],
        "quality_bound": {
            "policy": policy, "max_bpb_loss": bound, "requests_judged": judged,
            "optimal_vocab": bounded.vocab_size, "optimal_head": names[bounded.vocab_size],
            "admits_every_judged_request": shares[names[bounded.vocab_size]] == 1.0,
        },
        "units": {**UNITS, "within_bound_share": "fraction of the judged requests",
                  "max_bpb_loss": "relative BPB loss over the request's best head",
                  "batch": "sequences in the engine's step at each decision"},
    }
