"""The live prompt-BPB metrics: per head, the scored BPB, its smoothed value, the drift from
the manifest and the quality guard's exclusions (server/gateway/prompt_bpb.py fills them)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Gauge, Histogram

# Bits per byte: English prose is ~0.7-1.2 on small models, code lower, random bytes 4+.
_BPB_BUCKETS = (0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0)


class QualityMetrics:
    def __init__(self, r: CollectorRegistry) -> None:
        self.bpb = Histogram(
            "polyhead_prompt_bpb", "Live prompt bits per byte under the head that served it",
            ["head"], buckets=_BPB_BUCKETS, registry=r,
        )
        self.smoothed = Gauge(
            "polyhead_prompt_bpb_smoothed",
            "Smoothed live prompt BPB per head (what drift and the quality guard use)",
            ["head"], registry=r,
        )
        self.drift = Gauge(
            "polyhead_prompt_bpb_drift",
            "Smoothed live prompt BPB ÷ the manifest's BPB − 1; NaN without either", ["head"],
            registry=r,
        )
        self.drift_flag = Gauge(
            "polyhead_prompt_bpb_drift_flag",
            "1 when live BPB exceeds the manifest's by more than POLYHEAD_PROMPT_BPB_DRIFT",
            ["head"], registry=r,
        )
        self.guard_excluded = Gauge(
            "polyhead_guard_excluded", "1 while the quality guard keeps traffic off a head",
            ["head"], registry=r,
        )
