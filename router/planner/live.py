"""The planner fed by live traffic: which V is lifecycle-optimal for the B the gateway has
seen and the λ it has served, and each head's break-even λ against the training optimum.

The heads already exist, so their training is sunk for routing; this answers the planning
question instead: had the backbone been trained with vocabulary V, what would the traffic
so far cost? The B distribution is the live batch at each of the router's recent decisions
(equal weight per request), the context is each request's own; costs use the router's
timer, so a calibrated gateway plans with measured step times.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from router.cost import StepTimer, context_tokens, infer_cost_per_byte, train_cost_per_byte
from router.planner.plan import Line, ScopePlan, scope_json
from router.profiles import HeadProfile, RequestFeatures

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


def live_plan_json(profiles: Sequence[HeadProfile], timer: StepTimer,
                   recent: Sequence[tuple[RequestFeatures, int]], lam: float,
                   training_bytes: float | None, mfu: float = DEFAULT_MFU) -> dict[str, Any]:
    scope = live_scope(profiles, timer, recent, lam, mfu)
    batches = sorted(b for _, b in recent)
    names = {p.vocab_size: p.name for p in profiles}
    doc = scope_json(scope, training_bytes, (0.0, 0.1, 1.0, 10.0, 100.0))
    for c in doc["candidates"]:
        c["head"] = names[c["vocab_size"]]
    return {
        "requests": len(recent), "mfu": mfu,
        "batch": {"p50": batches[len(batches) // 2] if batches else None,
                  "max": batches[-1] if batches else None},
        **doc,
        "optimal_head": names[scope.optimal.vocab_size],
    }
