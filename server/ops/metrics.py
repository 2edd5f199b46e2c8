"""Prometheus metrics of one gateway, on a registry owned by the app (no global registry).

Label cardinality stays bounded: head names come from the manifest, policy names from the
policy registry, statuses from HTTP codes and routes from the fixed route table.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
)
from prometheus_client.core import CounterMetricFamily

from server.ops.drafting_metrics import DraftingMetrics
from server.ops.engine_metrics import EngineMetrics
from server.ops.quality_metrics import QualityMetrics

# Latency buckets in seconds: sub-millisecond gateway work up to multi-minute generations.
_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
# The gateway's own work and the gaps between tokens: 100 µs up to a second.
_FAST_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1,
                 0.25, 0.5, 1.0)


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
        # reason: router.stability.REASON_CODES, a fixed set (best, hysteresis, dwell, ...).
        self.decisions = Counter(
            "polyhead_decisions", "Routing decisions by chosen head, policy and reason code",
            ["head", "policy", "reason"], registry=r,
        )
        self._add_routing_metrics(r)
        self.ttft = Histogram(
            "polyhead_time_to_first_token_seconds", "Time from request to first token",
            ["head"], buckets=_LATENCY_BUCKETS, registry=r,
        )
        self.e2e = Histogram(
            "polyhead_request_duration_seconds", "Time from request to last byte",
            ["head"], buckets=_LATENCY_BUCKETS, registry=r,
        )
        self._add_operations_metrics(r)
        # polyhead_unembed_kernel_total{head,kernel}: the engine's counts, copied at scrape time.
        self.unembed_kernels = KernelCounts(registry=r)
        # polyhead_prefix_cache_{queries,hits}_total{head}: the local engine's counts, in tokens.
        self.prefix_cache = PrefixCacheCounts(registry=r)
        self.quality = QualityMetrics(r)  # live prompt BPB, drift, quality guard
        self.drafting = DraftingMetrics(r)  # the local engine's guard seconds and drafting
        self.engines = EngineMetrics(r)  # per vLLM replica: up, load, failovers

    def _add_operations_metrics(self, r: CollectorRegistry) -> None:
        self.http_latency = Histogram(
            "polyhead_http_request_duration_seconds",
            "HTTP request latency by route template, method and status (every route)",
            ["route", "method", "status"], buckets=_LATENCY_BUCKETS, registry=r,
        )
        self.itl = Histogram(
            "polyhead_inter_token_latency_seconds", "Gap between consecutive tokens of a choice",
            ["head"], buckets=_FAST_BUCKETS, registry=r,
        )
        self.queue_wait = Histogram(
            "polyhead_queue_wait_seconds",
            "Time from request arrival to its hand-off to the engine",
            ["head"], buckets=_LATENCY_BUCKETS, registry=r,
        )
        self.overhead = Histogram(
            "polyhead_gateway_overhead_seconds",
            "Time a /v1 request spends in the gateway, excluding waits on the engine",
            ["route"], buckets=_FAST_BUCKETS, registry=r,
        )
        self.policy_switches = Counter(
            "polyhead_policy_switches", "Policy changes through the admin API (set|rollback)",
            ["action"], registry=r,
        )
        self.admission_rejections = Counter(
            "polyhead_admission_rejections", "Requests refused with 429, by reason",
            ["reason"], registry=r,
        )
        self.client_requests = Counter(
            "polyhead_client_requests", "Admitted API requests by client key name",
            ["key"], registry=r,
        )
        self.head_up = Gauge(
            "polyhead_head_up", "1 while a head takes routed traffic, 0 while drained",
            ["head"], registry=r,
        )
        self.redis_up = Gauge(
            "polyhead_redis_up", "1 when Redis answers (or none is configured), else 0",
            registry=r,
        )
        self.redis_pending = Gauge(
            "polyhead_redis_pending_increments",
            "Counter increments buffered locally while Redis is unreachable", registry=r,
        )

    def _add_routing_metrics(self, r: CollectorRegistry) -> None:
        self.live_batch = Gauge(
            "polyhead_live_batch",
            "Live B: the engine's running batch per head group (head=\"all\": the engine), "
            "raw and smoothed over POLYHEAD_BATCH_WINDOW_S",
            ["head", "kind"], registry=r,
        )
        self.lambda_forecast = Gauge(
            "polyhead_lambda_forecast", "Operator forecast λ; NaN when none is set", registry=r,
        )
        self.lambda_effective = Gauge(
            "polyhead_lambda_effective", "The λ policies use: the forecast, else measured",
            registry=r,
        )
        self.head_max_batch = Gauge(
            "polyhead_head_max_batch",
            "Requests a head can hold at once within the KV budget (live usage included)",
            ["head"], registry=r,
        )
        self.kv_reserved_blocks = Gauge(
            "polyhead_kv_reserved_blocks", "KV blocks reserved by admitted requests", registry=r,
        )
        self.admission_queue = Gauge(
            "polyhead_admission_queue", "Requests waiting for KV-cache room", registry=r,
        )
        # Learned from finished requests (router.compression), persisted with λ's counters.
        self.output_bpt = Gauge(
            "polyhead_output_bytes_per_token",
            "Output bytes per token of finished requests, by head and script class",
            ["head", "script"], registry=r,
        )
        self.output_tokens = Gauge(
            "polyhead_output_tokens_observed",
            "Output tokens behind polyhead_output_bytes_per_token, by head and script class",
            ["head", "script"], registry=r,
        )
        self.head_moves = Counter(
            "polyhead_head_moves",
            "Requests the measured quality control moved up their ladder of native-stream "
            "heads, by from/to head and what moved them (prompt: the first prefill's "
            "measurement; probes: the running estimate during decode)",
            ["from_head", "to_head", "source"], registry=r,
        )
        self.measured_loss = Histogram(
            "polyhead_measured_prompt_loss",
            "Relative BPB loss against the native head measured on laddered prompts, per rung",
            ["head"], buckets=(0.0, 0.01, 0.02, 0.03, 0.05, 0.08, 0.12, 0.2, 0.5, 1.0),
            registry=r,
        )
        self.prompt_measurements = Counter(
            "polyhead_prompt_measurements",
            "Laddered requests by start head and whether the engine measured their prompt "
            "(skipped: their content class stayed put on that head)",
            ["head", "measured"], registry=r,
        )
        self.quality_excluded = Counter(
            "polyhead_quality_bound_exclusions",
            "Heads a request's predicted BPB penalty kept it off, by excluded head",
            ["head"], registry=r,
        )
        self.calibration = Gauge(
            "polyhead_cost_calibration",
            "Fitted step-time model: overhead_s, mem_scale, cmp_scale, rms_rel_error, samples",
            ["param"], registry=r,
        )

    def set_policy(self, name: str, version: int, changed_by: str) -> None:
        self.policy.info({"name": name, "version": str(version), "changed_by": changed_by})
        self.policy_version.set(version)


class KernelCounts:
    """Counter polyhead_unembed_kernel_total{head,kernel}: head groups per unembedding kernel.

    The engine owns the running counts; /metrics hands a snapshot to `set` before rendering.
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        self._counts: dict[tuple[str, str], int] = {}
        registry.register(self)

    def set(self, counts: dict[tuple[str, str], int]) -> None:
        self._counts = dict(counts)

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily(
            "polyhead_unembed_kernel", "Head groups unembedded, by head and kernel "
            "(fused | chunked | split; nested-<kernel>: one pass over the largest live "
            "head's rows with other heads nested in it)", labels=["head", "kernel"])
        for (head, kernel), n in sorted(self._counts.items()):
            family.add_metric([head, kernel], n)
        yield family


class PrefixCacheCounts:
    """Counters polyhead_prefix_cache_queries_total and _hits_total{head}, in prompt tokens (as
    vLLM's prefix_cache_queries / _hits), counted when a request first reaches the engine.

    The engine owns the running counts; /metrics hands a snapshot to `set` before rendering.
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        self._counts: dict[str, tuple[int, int]] = {}
        registry.register(self)

    def set(self, counts: dict[str, tuple[int, int]]) -> None:
        self._counts = dict(counts)

    def collect(self) -> Iterator[CounterMetricFamily]:
        queries = CounterMetricFamily(
            "polyhead_prefix_cache_queries", "Prompt tokens looked up in the prefix cache",
            labels=["head"])
        hits = CounterMetricFamily(
            "polyhead_prefix_cache_hits", "Prompt tokens served from the prefix cache",
            labels=["head"])
        for head, (q, h) in sorted(self._counts.items()):
            queries.add_metric([head], q)
            hits.add_metric([head], h)
        yield queries
        yield hits
