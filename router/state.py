"""Live per-head load and cumulative served volume, shared by the gateway and the engine.

λ = served bytes ÷ training bytes. Per head, it uses that head's own training bytes. In total,
it is all served bytes ÷ the backbone's training bytes, which is the largest of the heads'
figures: the heads share one backbone that was trained once, so summing their training bytes
would count that volume once per head. When the denominator is 0, λ is 0 (nothing to
amortize yet).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from router.errors import UnknownHead
from router.profiles import HeadProfile

log = logging.getLogger(__name__)


def _ratio(served: float, trained: float) -> float:
    return served / trained if trained > 0 else 0.0


@dataclass(frozen=True, slots=True)
class StateSnapshot:
    running: Mapping[str, int]
    waiting: Mapping[str, int]
    served_bytes: Mapping[str, int]
    served_tokens: Mapping[str, int]
    training_bytes: Mapping[str, float]

    def lam(self, head: str | None = None) -> float:
        if head is None:
            trained = max(self.training_bytes.values(), default=0.0)
            return _ratio(sum(self.served_bytes.values()), trained)
        if head not in self.training_bytes:
            raise UnknownHead(head, list(self.training_bytes))
        return _ratio(self.served_bytes[head], self.training_bytes[head])


class LiveState:
    """Thread-safe counters; the engine thread and request handlers both write here."""

    def __init__(self, training_bytes: Mapping[str, float]) -> None:
        if any(v < 0 for v in training_bytes.values()):
            raise ValueError("training bytes must be >= 0")
        self._lock = threading.Lock()
        self._training = dict(training_bytes)
        self._running = dict.fromkeys(self._training, 0)
        self._waiting = dict.fromkeys(self._training, 0)
        self._bytes = dict.fromkeys(self._training, 0)
        self._tokens = dict.fromkeys(self._training, 0)

    @classmethod
    def for_profiles(cls, profiles: Iterable[HeadProfile]) -> LiveState:
        return cls({p.name: p.training_bytes for p in profiles})

    @property
    def heads(self) -> tuple[str, ...]:
        return tuple(self._training)

    def _check(self, head: str) -> None:
        if head not in self._training:
            raise UnknownHead(head, list(self._training))

    def set_load(self, head: str, running: int, waiting: int) -> None:
        if running < 0 or waiting < 0:
            raise ValueError("running and waiting must be >= 0")
        self._check(head)
        with self._lock:
            self._running[head], self._waiting[head] = running, waiting

    def add_served(self, head: str, n_bytes: int, n_tokens: int) -> None:
        if n_bytes < 0 or n_tokens < 0:
            raise ValueError("served bytes and tokens must be >= 0")
        self._check(head)
        with self._lock:
            self._bytes[head] += n_bytes
            self._tokens[head] += n_tokens

    def restore_served(self, served_bytes: Mapping[str, int]) -> None:
        """Set cumulative served bytes, e.g. from a persisted store at startup."""
        for head in served_bytes:
            self._check(head)
        with self._lock:
            self._bytes.update(served_bytes)

    def lam(self, head: str | None = None) -> float:
        return self.snapshot().lam(head)

    def snapshot(self) -> StateSnapshot:
        with self._lock:
            return StateSnapshot(
                running=MappingProxyType(dict(self._running)),
                waiting=MappingProxyType(dict(self._waiting)),
                served_bytes=MappingProxyType(dict(self._bytes)),
                served_tokens=MappingProxyType(dict(self._tokens)),
                training_bytes=MappingProxyType(dict(self._training)),
            )
