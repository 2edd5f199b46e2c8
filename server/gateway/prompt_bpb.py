"""Live prompt BPB at the gateway: which requests are scored, and what a score updates.

The engine reports a prompt's NLL in nats (heads.engine.prompt_score); the gateway knows the
prompt's UTF-8 length, so it divides here and feeds the per-head histogram, the smoothed
value the quality guard reads (router.quality via LiveState) and the drift flag.
"""

from __future__ import annotations

import logging
import math
import random
from dataclasses import dataclass
from typing import Literal

from heads.engine.types import PromptScore
from heads.manifest import Manifest
from router.policy.guard import QualityGuard
from router.quality import HeadQuality, drift, drifted
from router.state import LiveState
from server.ops.quality_metrics import QualityMetrics
from server.settings import Settings

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class PromptBpbConfig:
    mode: Literal["on", "sampled", "off"] = "sampled"
    positions: int = 32  # sampled: prompt positions scored per request
    fraction: float = 0.1  # sampled: share of requests scored
    drift_threshold: float = 0.10  # flag when live BPB > manifest × (1 + this)
    min_samples: int = 5  # scored requests before a head can be flagged

    def __post_init__(self) -> None:
        if self.positions < 1 or not 0 <= self.fraction <= 1 or self.min_samples < 0:
            raise ValueError("prompt BPB: positions >= 1, fraction in [0, 1], min_samples >= 0")

    @staticmethod
    def from_settings(s: Settings) -> PromptBpbConfig:
        return PromptBpbConfig(s.prompt_bpb, s.prompt_bpb_positions, s.prompt_bpb_fraction,
                               s.prompt_bpb_drift, s.prompt_bpb_min_samples)

    def request(self, opt_in: bool | None, rng: random.Random) -> tuple[bool, int]:
        """(score this request?, positions: 0 = all). `opt_in` False is the client's opt-out."""
        if self.mode == "off" or opt_in is False:
            return False, 0
        if self.mode == "on":
            return True, 0
        return rng.random() < self.fraction, self.positions


def record(m: QualityMetrics, state: LiveState, manifest: Manifest, cfg: PromptBpbConfig,
           head: str, score: PromptScore, text_bytes: int) -> float | None:
    """Account one scored prompt; returns its BPB (None for a one-token or empty prompt)."""
    bpb = score.bpb(text_bytes)
    if bpb is None or not math.isfinite(bpb):
        return None
    m.bpb.labels(head).observe(bpb)
    q = state.quality.observe(head, bpb)
    publish(m, head, q, manifest.head(head).bpb, cfg)
    return bpb


def publish(m: QualityMetrics, head: str, q: HeadQuality, manifest_bpb: float | None,
            cfg: PromptBpbConfig) -> None:
    d = drift(q.bpb, manifest_bpb)
    m.smoothed.labels(head).set(float("nan") if q.bpb is None else q.bpb)
    m.drift.labels(head).set(float("nan") if d is None else d)
    flag = drifted(q, manifest_bpb, cfg.drift_threshold, cfg.min_samples)
    m.drift_flag.labels(head).set(1 if flag else 0)


def guard_excluded(policy: object) -> frozenset[str] | None:
    """Heads the active policy's quality guard excludes; None when the policy is unguarded."""
    return policy.excluded() if isinstance(policy, QualityGuard) else None


def head_view(head: str, q: HeadQuality, manifest_bpb: float | None, cfg: PromptBpbConfig,
              excluded: frozenset[str] | None) -> dict:
    """The live-quality fields of one head in GET /admin/heads."""
    return {"live_bpb": q.bpb, "bpb_samples": q.samples, "bpb_drift": drift(q.bpb, manifest_bpb),
            "drift_flag": drifted(q, manifest_bpb, cfg.drift_threshold, cfg.min_samples),
            "guard": None if excluded is None else
            ("excluded" if head in excluded else "eligible")}


def refresh(m: QualityMetrics, state: LiveState, manifest: Manifest, cfg: PromptBpbConfig,
            policy: object) -> None:
    """Scrape-time gauges: smoothed BPB and drift per head, and the guard's exclusions."""
    quality = state.snapshot().quality
    excluded = guard_excluded(policy) or frozenset()
    for h in manifest.heads:
        publish(m, h.name, quality.get(h.name, HeadQuality()), h.bpb, cfg)
        m.guard_excluded.labels(h.name).set(1 if h.name in excluded else 0)
