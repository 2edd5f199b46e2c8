"""Live per-head load and cumulative served volume, shared by the gateway and the engine.

λ = served bytes ÷ training bytes. Per head, it uses that head's own training bytes. In total,
it is all served bytes ÷ the backbone's training bytes, which is the largest of the heads'
figures: the heads share one backbone that was trained once, so summing their training bytes
would count that volume once per head. When the denominator is 0, λ is 0 (nothing to
amortize yet). An operator's forecast λ, when set, replaces the measured total in
`effective_lam` (the λ the policies use); the measured figures stay visible.

Live B is the engine's running batch per head group. Its smoothed value is an exponential
moving average with time constant `window_s` over the samples `set_load` receives, so a
burst of a few milliseconds does not flip the policy; window_s = 0 means raw.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from router.compression import split_key, stat_key
from router.errors import UnknownHead
from router.ladder_outcomes import LadderOutcomes
from router.profiles import HeadProfile
from router.quality import DEFAULT_ALPHA, BpbTracker, HeadQuality

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
    smoothed_running: Mapping[str, float] = field(default_factory=dict)
    lambda_forecast: float | None = None
    quality: Mapping[str, HeadQuality] = field(default_factory=dict)  # live prompt BPB
    # Finished requests' output, keyed "head/script" (router.compression): the live
    # bytes/token each head achieves on each script class.
    output_bytes: Mapping[str, int] = field(default_factory=dict)
    output_tokens: Mapping[str, int] = field(default_factory=dict)
    # Laddered requests' output bytes per rung, keyed "start head/class" (router.ladder_outcomes)
    ladders: Mapping[str, Mapping[str, float]] = field(default_factory=dict)

    @property
    def batch(self) -> int:
        """Live B: requests in the engine's running batch, all head groups."""
        return sum(self.running.values())

    @property
    def smoothed_batch(self) -> float:
        return sum(self.smoothed_running.values()) if self.smoothed_running else self.batch

    @property
    def queue(self) -> int:
        return sum(self.waiting.values())

    def effective_lam(self) -> float:
        """The λ policies use: the operator's forecast if set, else the measured total."""
        return self.lam() if self.lambda_forecast is None else self.lambda_forecast

    def lam(self, head: str | None = None) -> float:
        if head is None:
            trained = max(self.training_bytes.values(), default=0.0)
            return _ratio(sum(self.served_bytes.values()), trained)
        if head not in self.training_bytes:
            raise UnknownHead(head, list(self.training_bytes))
        return _ratio(self.served_bytes[head], self.training_bytes[head])


class LiveState:
    """Thread-safe counters; the engine thread and request handlers both write here."""

    def __init__(self, training_bytes: Mapping[str, float], window_s: float = 5.0,
                 bpb_alpha: float = DEFAULT_ALPHA) -> None:
        if any(v < 0 for v in training_bytes.values()):
            raise ValueError("training bytes must be >= 0")
        if window_s < 0:
            raise ValueError("window_s must be >= 0")
        self.window_s = window_s
        self._smoothed: dict[str, float] = dict.fromkeys(training_bytes, 0.0)
        self._sampled_at: float | None = None
        self._forecast: float | None = None
        self._lock = threading.Lock()
        self._training = dict(training_bytes)
        self._running = dict.fromkeys(self._training, 0)
        self._waiting = dict.fromkeys(self._training, 0)
        self._bytes = dict.fromkeys(self._training, 0)
        self._tokens = dict.fromkeys(self._training, 0)
        self._out_bytes: dict[str, int] = {}
        self._out_tokens: dict[str, int] = {}
        self.quality = BpbTracker(self._training, bpb_alpha)
        self.ladders = LadderOutcomes()

    @classmethod
    def for_profiles(cls, profiles: Iterable[HeadProfile], window_s: float = 5.0,
                     bpb_alpha: float = DEFAULT_ALPHA) -> LiveState:
        return cls({p.name: p.training_bytes for p in profiles}, window_s, bpb_alpha)

    @property
    def heads(self) -> tuple[str, ...]:
        return tuple(self._training)

    def _check(self, head: str) -> None:
        if head not in self._training:
            raise UnknownHead(head, list(self._training))

    def set_load(self, head: str, running: int, waiting: int, now: float | None = None) -> None:
        self.set_loads({head: (running, waiting)}, now)

    def set_loads(self, loads: Mapping[str, tuple[int, int]], now: float | None = None) -> None:
        """Raw (running, waiting) per head; heads left out keep their last values."""
        for head, (running, waiting) in loads.items():
            if running < 0 or waiting < 0:
                raise ValueError("running and waiting must be >= 0")
            self._check(head)
        now = time.monotonic() if now is None else now
        with self._lock:
            for head, (running, waiting) in loads.items():
                self._running[head], self._waiting[head] = running, waiting
            last, self._sampled_at = self._sampled_at, now
            if last is None or self.window_s == 0:
                self._smoothed = {h: float(r) for h, r in self._running.items()}
                return
            # The previous value held for dt; EWMA weight of the new one: 1 - e^(-dt/τ).
            w = 1.0 - math.exp(-max(0.0, now - last) / self.window_s)
            self._smoothed = {h: self._smoothed[h] + w * (r - self._smoothed[h])
                              for h, r in self._running.items()}

    def set_lambda_forecast(self, lam: float | None) -> None:
        if lam is not None and (not math.isfinite(lam) or lam < 0):
            raise ValueError(f"forecast λ must be a finite number >= 0, got {lam}")
        with self._lock:
            self._forecast = lam

    @property
    def lambda_forecast(self) -> float | None:
        return self._forecast

    def add_served(self, head: str, n_bytes: int, n_tokens: int) -> None:
        if n_bytes < 0 or n_tokens < 0:
            raise ValueError("served bytes and tokens must be >= 0")
        self._check(head)
        with self._lock:
            self._bytes[head] += n_bytes
            self._tokens[head] += n_tokens

    def add_output(self, head: str, script: str, n_bytes: int, n_tokens: int) -> None:
        """One finished request's generated text: its bytes and tokens on `head`."""
        if n_bytes < 0 or n_tokens < 0:
            raise ValueError("output bytes and tokens must be >= 0")
        self._check(head)
        key = stat_key(head, script)
        with self._lock:
            self._out_bytes[key] = self._out_bytes.get(key, 0) + n_bytes
            self._out_tokens[key] = self._out_tokens.get(key, 0) + n_tokens

    def restore_output(self, out_bytes: Mapping[str, int], out_tokens: Mapping[str, int],
                       old_bytes: Mapping[str, int] | None = None,
                       old_tokens: Mapping[str, int] | None = None) -> None:
        """Replace the `old` part of each output counter by the store's, keeping increments
        made since (no `old`: at startup). Keys of heads this model does not serve are kept
        out, as for λ's counters."""
        with self._lock:
            for mine, new, old in ((self._out_bytes, out_bytes, old_bytes or {}),
                                   (self._out_tokens, out_tokens, old_tokens or {})):
                for key in {*new, *old}:
                    if split_key(key)[0] in self._training:
                        mine[key] = mine.get(key, 0) + int(new.get(key, 0)) - int(
                            old.get(key, 0))

    def restore_served(
        self, served_bytes: Mapping[str, int], served_tokens: Mapping[str, int] | None = None
    ) -> None:
        """Set cumulative served bytes (and tokens), e.g. from a persisted store at startup.

        Heads the store knows but this model does not serve are ignored: a head may have
        been retired since the counters were written.
        """
        with self._lock:
            self._bytes.update({h: int(v) for h, v in served_bytes.items() if h in self._bytes})
            if served_tokens:
                self._tokens.update(
                    {h: int(v) for h, v in served_tokens.items() if h in self._tokens})

    def rebase_served(
        self, old_bytes: Mapping[str, int], old_tokens: Mapping[str, int],
        new_bytes: Mapping[str, int], new_tokens: Mapping[str, int],
    ) -> None:
        """Replace the `old` part of each counter by `new`, keeping increments made since."""
        with self._lock:
            for h in self._bytes:
                self._bytes[h] += int(new_bytes.get(h, 0)) - int(old_bytes.get(h, 0))
                self._tokens[h] += int(new_tokens.get(h, 0)) - int(old_tokens.get(h, 0))

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
                smoothed_running=MappingProxyType(dict(self._smoothed)),
                lambda_forecast=self._forecast,
                quality=self.quality.snapshot(),
                output_bytes=MappingProxyType(dict(self._out_bytes)),
                output_tokens=MappingProxyType(dict(self._out_tokens)),
                ladders=self.ladders.snapshot(),
            )
