"""Per-replica engine series for the vLLM backend, copied from the backend at scrape time:
polyhead_engine_up, _running, _waiting, _kv_usage (gauges) and polyhead_engine_failovers_total,
polyhead_engine_lost_streams_total (counters), all labelled by engine (a URL or "in-process")."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric


@dataclass(frozen=True, slots=True)
class ReplicaStats:
    engine: str
    up: bool
    running: int  # vLLM's own gauges, as of the last health poll
    waiting: int
    kv_usage: float  # 0..1
    failovers: int  # requests moved to another replica after this one failed
    lost_streams: int  # streams cut mid-way when this one failed


class EngineMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self._stats: list[ReplicaStats] = []
        registry.register(self)

    def set(self, stats: list[ReplicaStats]) -> None:
        self._stats = list(stats)

    def collect(self) -> Iterator[Metric]:
        gauges = {
            "up": GaugeMetricFamily("polyhead_engine_up", "1 while the engine replica answers "
                                    "its health check", labels=["engine"]),
            "running": GaugeMetricFamily("polyhead_engine_running_requests",
                                         "The replica's vllm:num_requests_running",
                                         labels=["engine"]),
            "waiting": GaugeMetricFamily("polyhead_engine_waiting_requests",
                                         "The replica's vllm:num_requests_waiting",
                                         labels=["engine"]),
            "kv_usage": GaugeMetricFamily("polyhead_engine_kv_usage_ratio",
                                          "The replica's vllm:kv_cache_usage_perc (0..1)",
                                          labels=["engine"]),
        }
        counters = {
            "failovers": CounterMetricFamily("polyhead_engine_failovers",
                                             "Requests failed over to another replica",
                                             labels=["engine"]),
            "lost_streams": CounterMetricFamily("polyhead_engine_lost_streams",
                                                "Streams ended with an error when the replica "
                                                "failed mid-way", labels=["engine"]),
        }
        for s in self._stats:
            for key, family in gauges.items():
                family.add_metric([s.engine], float(getattr(s, key)))
            for key, cfamily in counters.items():
                cfamily.add_metric([s.engine], getattr(s, key))
        yield from gauges.values()
        yield from counters.values()
