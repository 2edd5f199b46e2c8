"""The local engine's quality guard and exact drafting, as Prometheus counters.

The engine owns the running totals; /metrics hands a snapshot to `set` before rendering:

- polyhead_quality_guard_seconds_total{phase}: the measured quality control's time inside
  steps ("prompt": measuring prompts at prefill; "probe": the decode probes);
- per drafter head (a reading drafting for the native head, heads.engine.drafting):
  polyhead_drafts_total and polyhead_drafts_accepted_total (acceptance is their ratio),
  polyhead_draft_verifies_total and polyhead_draft_verified_tokens_total (tokens per verify
  is their ratio), polyhead_draft_verify_seconds_total;
- polyhead_draft_k: the k the last drafting step chose (0: plain native steps).
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from heads.engine.types import DraftTally


class DraftingMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self._guard: tuple[float, float] = (0.0, 0.0)
        self._tallies: dict[str, DraftTally] = {}
        self._k = 0
        registry.register(self)

    def set(self, guard: tuple[float, float], tallies: dict[str, DraftTally], k: int) -> None:
        """guard: (prompt, probe) seconds; tallies: drafter -> its totals."""
        self._guard, self._tallies, self._k = guard, dict(tallies), k

    def collect(self) -> Iterator[Metric]:
        guard = CounterMetricFamily(
            "polyhead_quality_guard_seconds", "Seconds the measured quality control spent "
            "inside engine steps: measuring prompts, and probing decode", labels=["phase"])
        guard.add_metric(["prompt"], self._guard[0])
        guard.add_metric(["probe"], self._guard[1])
        yield guard
        fields = (("drafts", "Drafts the native head judged (each verify counts up to its "
                             "first rejected draft)", "drafted"),
                  ("drafts_accepted", "Drafts the native head accepted", "accepted"),
                  ("draft_verifies", "Verifies of one sequence's pending drafts", "verifies"),
                  ("draft_verified_tokens", "Tokens verifies committed (accepted drafts and "
                                            "the native token after them)", "committed"),
                  ("draft_verify_seconds", "Unembedding seconds of the verifying steps, "
                                           "shared among their verifies", "verify_seconds"))
        for name, doc, attr in fields:
            family = CounterMetricFamily(f"polyhead_{name}", doc, labels=["drafter"])
            for drafter, t in sorted(self._tallies.items()):
                family.add_metric([drafter], getattr(t, attr))
            yield family
        yield GaugeMetricFamily("polyhead_draft_k", "Drafts per verify the last drafting "
                                "step chose (0: plain native steps)", value=self._k)
