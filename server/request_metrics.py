"""Per-choice timings observed once a request ends (never inside the per-token loop)."""

from __future__ import annotations

from server.generation import Outcome
from server.metrics import Metrics
from server.request_plan import RequestPlan


def observe_choices(metrics: Metrics, plan: RequestPlan, outcomes: list[Outcome]) -> None:
    itl = metrics.itl.labels(plan.head)
    for o in outcomes:
        for gap in o.itl:
            itl.observe(gap)
    submitted = [o.submitted_at for o in outcomes if o.submitted_at is not None]
    if submitted:
        metrics.queue_wait.labels(plan.head).observe(max(0.0, min(submitted) - plan.started_at))
