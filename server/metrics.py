"""Prometheus metrics of one gateway, on a registry owned by the app (no global registry).

Label cardinality stays bounded: head names come from the manifest, policy names from the
policy registry, statuses from HTTP codes and routes from the fixed route table.
"""

from __future__ import annotations

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
)

# Latency buckets in seconds: sub-millisecond gateway work up to multi-minute generations.
_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "polyhead_requests", "Finished API requests",
            ["route", "head", "policy", "status"], registry=r,
        )
        self.tokens = Counter(
            "polyhead_tokens", "Tokens by head and direction (prompt|generated)",
            ["head", "direction"], registry=r,
        )
        self.bytes = Counter(
            "polyhead_text_bytes", "UTF-8 bytes of text by head and direction (prompt|generated)",
            ["head", "direction"], registry=r,
        )
        self.running = Gauge(
            "polyhead_running_requests", "Requests in the engine's running batch (live B)",
            ["head"], registry=r,
        )
        self.waiting = Gauge(
            "polyhead_waiting_requests", "Requests queued for the engine", ["head"], registry=r,
        )
        self.lam = Gauge(
            "polyhead_lambda", "Served bytes / training bytes; head=\"all\" is the total",
            ["head"], registry=r,
        )
        self.kv_blocks_used = Gauge(
            "polyhead_kv_blocks_used", "KV-cache blocks held by requests", registry=r,
        )
        self.kv_blocks_total = Gauge(
            "polyhead_kv_blocks_total", "KV-cache blocks in the engine", registry=r,
        )
        self.policy = Info("polyhead_policy", "The active routing policy", registry=r)
        self.policy_version = Gauge(
            "polyhead_policy_version", "Version of the active routing policy", registry=r,
        )
        self.decisions = Counter(
            "polyhead_decisions", "Routing decisions by chosen head and policy",
            ["head", "policy"], registry=r,
        )
        self.ttft = Histogram(
            "polyhead_time_to_first_token_seconds", "Time from request to first token",
            ["head"], buckets=_LATENCY_BUCKETS, registry=r,
        )
        self.e2e = Histogram(
            "polyhead_request_duration_seconds", "Time from request to last byte",
            ["head"], buckets=_LATENCY_BUCKETS, registry=r,
        )

    def set_policy(self, name: str, version: int, changed_by: str) -> None:
        self.policy.info({"name": name, "version": str(version), "changed_by": changed_by})
        self.policy_version.set(version)
