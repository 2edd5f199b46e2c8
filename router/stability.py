"""Anti-flapping shared by every switching policy: hysteresis, minimum dwell, switch cap.

A policy proposes the head it would pick now; the stabilizer decides whether traffic moves:

- hysteresis: the policy says whether the proposal clears its margin against the held head;
- minimum dwell: the held head keeps traffic for at least `min_dwell_s` after a switch;
- cap: at most `max_switches_per_min` switches in any trailing 60 s (0 = no cap).

The outcome's code is one of REASON_CODES, a bounded label for metrics.
"""

from __future__ import annotations

import logging
import math
import threading
from collections import deque
from collections.abc import Callable, Collection

log = logging.getLogger(__name__)

Clock = Callable[[], float]

# Every decision's reason code; a fixed set, so it can label a Prometheus counter.
REASON_CODES = ("best", "hysteresis", "dwell", "flap_cap", "pinned", "weighted",
                "request_pin", "spill", "content", "quality_bound",
                "affinity", "exact")


class Stabilizer:
    def __init__(self, min_dwell_s: float, max_switches_per_min: int, clock: Clock) -> None:
        self.min_dwell_s = min_dwell_s
        self.max_switches_per_min = max_switches_per_min
        self._clock = clock
        self._lock = threading.Lock()
        self._held: str | None = None
        self._since = 0.0
        self._recent: deque[float] = deque()
        self.switches = 0  # head changes after the first choice

    @property
    def held(self) -> str | None:
        return self._held

    def choose(
        self, proposal: str, available: Collection[str], clears_margin: Callable[[str], bool]
    ) -> tuple[str, str]:
        """-> (head, code). `clears_margin(held)` is asked only when a switch is possible."""
        with self._lock:
            held, now = self._held, self._clock()
            if held is None or held not in available:
                # A forced move (first choice, or the held head was drained) starts no dwell:
                # it was not a judgement about costs, so returning must not wait.
                self._move(proposal, -math.inf, counted=held is not None)
                return proposal, "best"
            if proposal == held:
                return held, "best"
            if not clears_margin(held):
                return held, "hysteresis"
            if now - self._since < self.min_dwell_s:
                return held, "dwell"
            cap = self.max_switches_per_min
            while self._recent and now - self._recent[0] >= 60.0:
                self._recent.popleft()
            if cap and len(self._recent) >= cap:
                return held, "flap_cap"
            self._move(proposal, now, counted=True)
            return proposal, "best"

    def _move(self, head: str, since: float, counted: bool) -> None:
        self._held, self._since = head, since
        if counted:
            self.switches += 1
            self._recent.append(self._clock() if since == -math.inf else since)
