"""The last N routing decisions, newest last, in a bounded ring buffer (thread-safe)."""

from __future__ import annotations

import logging
import threading
from collections import deque

from router.policy.base import Decision

log = logging.getLogger(__name__)

DEFAULT_CAPACITY = 1024


class DecisionLog:
    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        if capacity < 1:
            raise ValueError("decision log capacity must be >= 1")
        self._lock = threading.Lock()
        self._buf: deque[Decision] = deque(maxlen=capacity)
        self.total = 0  # decisions ever recorded

    @property
    def capacity(self) -> int:
        return self._buf.maxlen or 0

    def append(self, decision: Decision) -> None:
        with self._lock:
            self._buf.append(decision)
            self.total += 1

    def last(self, limit: int) -> list[Decision]:
        """Up to `limit` most recent decisions, newest first."""
        if limit <= 0:
            return []
        with self._lock:
            n = min(limit, len(self._buf))
            return [self._buf[-1 - i] for i in range(n)]
