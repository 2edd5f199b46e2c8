"""Live prompt BPB per head: a smoothed value over requests, and its drift from the manifest.

Each scored request adds one sample (bits per UTF-8 byte of its prompt, under the head that
served it). The smoothed value is the plain mean of the first 1/alpha samples, then an EWMA
with weight alpha per sample: smoothing by requests, not by time, because scored requests
arrive irregularly and a head with no traffic has no evidence to decay towards. A head whose
latest sample is a whole window (1/alpha scored requests, all heads) old starts over at its
next sample: its old value describes traffic that has gone elsewhere since.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from router.errors import UnknownHead

log = logging.getLogger(__name__)

DEFAULT_ALPHA = 0.2  # weight of a new sample: about the last 5 requests dominate


@dataclass(frozen=True, slots=True)
class HeadQuality:
    bpb: float | None = None  # smoothed live prompt BPB, bits/byte; None before any sample
    samples: int = 0  # scored requests behind `bpb` (since the last start-over)
    last_seq: int = 0  # tracker-wide index of this head's latest sample; 0: none yet


class BpbTracker:
    """Thread-safe: request handlers observe, the router and /metrics read snapshots."""

    def __init__(self, heads: Iterable[str], alpha: float = DEFAULT_ALPHA) -> None:
        if not 0 < alpha <= 1:
            raise ValueError(f"alpha must be in (0, 1], got {alpha}")
        self.alpha = alpha
        self.window = math.ceil(1 / alpha)  # scored requests, all heads
        self._lock = threading.Lock()
        self._heads: dict[str, HeadQuality] = {h: HeadQuality() for h in heads}
        self._seq = 0

    def observe(self, head: str, bpb: float) -> HeadQuality:
        if head not in self._heads:
            raise UnknownHead(head, list(self._heads))
        if not math.isfinite(bpb) or bpb < 0:
            raise ValueError(f"BPB must be a finite number >= 0, got {bpb}")
        with self._lock:
            q = self._heads[head]
            if q.samples and self._seq - q.last_seq >= self.window:
                q = HeadQuality()  # stale: start over
            n = q.samples + 1
            w = max(self.alpha, 1.0 / n)  # mean until 1/alpha samples, then EWMA
            value = bpb if q.bpb is None else q.bpb + w * (bpb - q.bpb)
            self._seq += 1
            self._heads[head] = new = HeadQuality(value, n, self._seq)
        return new

    def snapshot(self) -> Mapping[str, HeadQuality]:
        with self._lock:
            return MappingProxyType(dict(self._heads))


def drift(live: float | None, manifest: float | None) -> float | None:
    """Relative drift of live BPB from the manifest's held-out figure (+0.1: 10% worse)."""
    if live is None or manifest is None or manifest <= 0:
        return None
    return live / manifest - 1.0


def drifted(q: HeadQuality, manifest: float | None, threshold: float, min_samples: int) -> bool:
    """Flag: enough samples, and live BPB worse than the manifest's by more than threshold."""
    d = drift(q.bpb, manifest)
    return d is not None and q.samples >= min_samples and d > threshold
