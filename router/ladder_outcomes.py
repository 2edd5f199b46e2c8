"""Where laddered requests end up, so the router prices a reading as it is served.

A request routed to a two-level reading with a quality ladder (heads.engine.quality_control)
may be moved up to a larger reading or the native head while it decodes; its output bytes
are then served at those rungs' step costs. Priced at the reading's own step cost alone, a
reading that is moved most of the time looks cheaper than it is: the router sent German
prose to the 32k reading, which moved it to the native head, where pinning the 131k head
from the start would have served it faster.

Each finished laddered request adds its output bytes per rung to a counter keyed by the head
it started on and its content class: the prompt's script plus the half-octave of the start
head's predicted BPB penalty (router.segmentation), which orders code < English < German on
the demo, all one script. A class's byte shares are shrunk towards "stays on the start
head" by PRIOR_BYTES, so a class seen once moves the price a little and a class seen often
decides it. Not towards its script's: on the demo the script lumps Python with English and
German prose, and a class priced by the others' moves would not be tried on its own.

price(start) = Σ_rung share_rung · price(rung), each rung priced per served byte as the
policy prices a head (router.policy.builtin). A class that stays put skips the prompt
measurement (stays_put). Counted in process, not persisted.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Mapping
from types import MappingProxyType

from router.compression import stat_key

PRIOR_BYTES = 512.0  # evidence behind the "stays put" prior, in output bytes
# A class whose laddered requests kept this share of STAY_EVIDENCE_BYTES or more of their
# output bytes on the start head starts there unmeasured (stays_put).
STAY_SHARE = 0.95
STAY_EVIDENCE_BYTES = 2048.0
PENALTY_UNIT = 0.01  # the penalty buckets' origin: half-octaves above 1% BPB


def content_class(script: str, penalty: float | None) -> str:
    """`script` with the half-octave of the predicted penalty: "latin~9" (19–27% BPB)."""
    if penalty is None or penalty <= PENALTY_UNIT:
        return f"{script}~0"
    return f"{script}~{round(2 * math.log2(penalty / PENALTY_UNIT))}"


class LadderOutcomes:
    """Thread-safe output bytes per (start head, content class) and rung."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._bytes: dict[str, dict[str, float]] = {}

    def add(self, start: str, script: str, penalty: float | None,
            rung_bytes: Mapping[str, int]) -> None:
        """One finished laddered request: its output bytes by the rung that served them."""
        if any(v < 0 for v in rung_bytes.values()):
            raise ValueError("rung bytes must be >= 0")
        cls = content_class(script, penalty)
        with self._lock:
            counts = self._bytes.setdefault(stat_key(start, cls), {})
            for rung, n in rung_bytes.items():
                counts[rung] = counts.get(rung, 0.0) + n

    def snapshot(self) -> Mapping[str, Mapping[str, float]]:
        with self._lock:
            return MappingProxyType({k: MappingProxyType(dict(v))
                                     for k, v in self._bytes.items()})


def rung_shares(outcomes: Mapping[str, Mapping[str, float]], start: str, script: str,
                penalty: float | None) -> dict[str, float]:
    """Expected share of a request's output bytes per rung, for one starting on `start`:
    {start: 1.0} until laddered requests of its class have finished."""
    counts = outcomes.get(stat_key(start, content_class(script, penalty)), {})
    total = sum(counts.values()) + PRIOR_BYTES
    return {r: (counts.get(r, 0.0) + (PRIOR_BYTES if r == start else 0.0)) / total
            for r in {start, *counts}}


def stays_put(outcomes: Mapping[str, Mapping[str, float]], start: str, script: str,
              penalty: float | None) -> bool:
    """Whether requests of this class starting on `start` have stayed there: STAY_SHARE of
    at least STAY_EVIDENCE_BYTES of their output, counted, not shrunk. Such a request skips
    the prompt measurement (one [k, d] × [V_native, d] product, about as long as its prefill
    on the demo) and the decode probes alone guard it; its bytes keep counting here, so a
    class that starts moving is measured again."""
    counts = outcomes.get(stat_key(start, content_class(script, penalty)), {})
    total = sum(counts.values())
    return total >= STAY_EVIDENCE_BYTES and counts.get(start, 0.0) >= STAY_SHARE * total


def served_price(start: str, shares: Mapping[str, float],
                 price: Callable[[str], float | None]) -> float | None:
    """Σ share · price over the rungs that can be priced (renormalised); None when the
    start head itself cannot be."""
    own = price(start)
    if own is None:
        return None
    priced = {r: (own if r == start else price(r)) for r in shares}
    kept = {r: p for r, p in priced.items() if p is not None}
    weight = sum(shares[r] for r in kept)
    return sum(shares[r] * p for r, p in kept.items()) / weight
