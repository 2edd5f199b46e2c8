"""Calibrated step times: fit the cost model's efficiencies to measured engine steps.

Each measured decode step gives its head groups and its wall time t. The model explains it as

    t ≈ c0 + c_mem · memory_s + c_cmp · compute_s

where memory_s and compute_s are the analytic times of the step's resources (router.cost):
1/c_mem and 1/c_cmp are the achieved fractions of peak bandwidth and FLOP/s, c0 the fixed
per-step overhead (host, launches, Python). The three coefficients are fitted by least
squares, clamped to >= 0, once enough distinct shapes are measured. A shape measured before
(same heads, batch, context bucket) uses its own smoothed time; a shape never measured uses
the fit, or the analytic floors' midpoint until there is a fit. A fitted time is never below
the optimistic floor, scaled by the lowest measured time ÷ floor seen (at most 1): the analytic
floor counts every weight at the profile's width and the device's nominal bandwidth, and an
engine reading int8 rows at one row, or a machine faster than its nominal figure, beats it.
Unscaled, that floor priced the demo's native head at 27 ms a step while it measured 15 ms.
Prefill steps are fitted apart (router.prefill_time_fit), in `prefill`.
"""

from __future__ import annotations

import logging
import math
import threading
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from kernels.crossover_calibration import CrossoverCalibration
from kernels.devices import DeviceSpec
from router.cost import Group, StepCost, mixed_step_cost
from router.nonneg_fit import fit_nonneg
from router.prefill_time_fit import FittedPrefillTime, PrefillSample
from router.profiles import HeadProfile

log = logging.getLogger(__name__)

MIN_FIT_SAMPLES = 8
MAX_SAMPLES = 2048
EWMA = 0.2  # weight of a new measurement in a shape's smoothed time
OUTLIER = 2.0  # a measurement moves a shape's time as if it were at most this factor off


@dataclass(frozen=True, slots=True)
class StepSample:
    """One measured engine step: head name -> (batch, mean context tokens), and its time."""

    groups: tuple[tuple[str, int, float], ...]
    seconds: float


def _shape_key(groups: Iterable[Group]) -> tuple[tuple[str, int, int], ...]:
    # Context in power-of-two buckets: steps a few tokens apart share one entry.
    return tuple(sorted((g.head.name, g.batch, max(0, math.ceil(math.log2(g.ctx_tokens + 1))))
                        for g in groups))


class MeasuredStep(Protocol):
    """An engine's step timing (heads.engine.types.StepTiming), as the timer reads it."""

    @property
    def prefill(self) -> bool: ...
    @property
    def groups(self) -> tuple[tuple[str, int, float], ...]: ...
    @property
    def prompts(self) -> tuple[tuple[str, int, int], ...]: ...
    @property
    def seconds(self) -> float: ...


@dataclass(frozen=True, slots=True)
class StepTimeFit:
    overhead_s: float
    mem_scale: float  # 1 / achieved fraction of peak bandwidth
    cmp_scale: float  # 1 / achieved fraction of peak FLOP/s
    samples: int
    rms_rel_error: float


class FittedStepTimer:
    """A StepTimer that learns from measured steps; thread-safe."""

    def __init__(self, device: DeviceSpec, heads: Iterable = (),
                 kernel_calibration: CrossoverCalibration | None = None) -> None:
        self.device = device
        self.kernel_calibration = kernel_calibration  # the engine's, for the kernel per group
        self._heads = {h.name: h for h in heads}
        self._lock = threading.Lock()
        self._samples: deque[tuple[float, float, float]] = deque(maxlen=MAX_SAMPLES)
        self._shapes: dict[tuple, float] = {}
        self._fit: StepTimeFit | None = None
        self._floor_scale = 1.0  # min measured ÷ optimistic floor over the samples, <= 1
        self._dirty = False
        self._recorded = 0  # samples accepted so far (the deque keeps the last MAX_SAMPLES)
        self.prefill = FittedPrefillTime(device, self._heads.values())  # the prompts' fit

    @property
    def sample_count(self) -> int:
        return self._recorded

    @property
    def fit(self) -> StepTimeFit | None:
        with self._lock:
            self._refit()
            return self._fit

    def record_step(self, step: MeasuredStep) -> None:
        """A measured engine step: a prefill into the prompts' fit, a decode step here."""
        if step.prefill:
            self.prefill.record(PrefillSample(step.prompts, step.seconds))
        else:
            self.record(StepSample(step.groups, step.seconds))

    def record(self, sample: StepSample) -> None:
        groups = [Group(self._heads[name], b, ctx) for name, b, ctx in sample.groups
                  if name in self._heads and b > 0]
        if not groups or sample.seconds <= 0:
            return
        cost = mixed_step_cost(groups, self.device, self.kernel_calibration)
        key = _shape_key(groups)
        with self._lock:
            old = self._shapes.get(key)
            if old is None:
                near = self._nearest_context(key)
                # A first sample far off its neighbour's time (a GC pause, a lazily
                # built kernel) would price the head for many steps, and a head priced
                # out is not chosen again to be re-measured: it starts within 2x of it.
                self._shapes[key] = sample.seconds if near is None else min(
                    max(sample.seconds, near[1] / OUTLIER), near[1] * OUTLIER)
            else:
                clipped = min(max(sample.seconds, old / OUTLIER), old * OUTLIER)
                self._shapes[key] = (1 - EWMA) * old + EWMA * clipped
            self._samples.append((cost.memory_s, cost.compute_s, sample.seconds))
            self._floor_scale = min(self._floor_scale, sample.seconds / cost.optimistic_s)
            self._recorded += 1
            self._dirty = True

    def _nearest_context(self, key: tuple[tuple[str, int, int], ...]
                         ) -> tuple[list[Group], float] | None:
        """-> (groups at the measured context nearest to `key`'s, their smoothed time) among
        shapes of the same heads and batches; None when there is none. Callers hold the
        lock."""
        best: tuple[int, tuple[tuple[str, int, int], ...], float] | None = None
        for other, seconds in self._shapes.items():
            if len(other) != len(key) or any(
                    (a[0], a[1]) != (b[0], b[1]) for a, b in zip(other, key, strict=True)):
                continue
            gap = sum(abs(a[2] - b[2]) for a, b in zip(other, key, strict=True))
            if best is None or gap < best[0]:
                best = (gap, other, seconds)
        if best is None:
            return None
        # A bucket's context: the middle of its power-of-two range
        groups = [Group(self._heads[h], b, 1.5 * 2 ** (c - 1) if c else 0.0)
                  for h, b, c in best[1]]
        return groups, best[2]

    def _refit(self) -> None:
        # Callers hold the lock.
        if not self._dirty or len(self._samples) < MIN_FIT_SAMPLES:
            return
        self._dirty = False
        fitted = fit_nonneg([((m, c), t) for m, c, t in self._samples])
        if fitted is not None:
            (c0, cm, cc), err = fitted
            self._fit = StepTimeFit(c0, cm, cc, len(self._samples), err)

    def step_time(self, groups: Sequence[Group]) -> float:
        key = _shape_key(groups)
        with self._lock:
            measured = self._shapes.get(key)
            if measured is not None:
                return measured
            near = self._nearest_context(key)
            self._refit()
            fit, scale = self._fit, self._floor_scale
        cost = mixed_step_cost(groups, self.device, self.kernel_calibration)
        floor = scale * cost.optimistic_s
        if near is not None:
            # The same heads and batch measured at another context: its time, moved by
            # what the analytic model says the context difference costs.
            other, seconds = near
            ref = mixed_step_cost(other, self.device, self.kernel_calibration)
            return max(floor, seconds + cost.estimate_s - ref.estimate_s)
        return self._modelled(cost, fit, floor)

    def model_time(self, groups: Sequence[Group]) -> float:
        """The fit's time for `groups` (the analytic midpoint before there is one), never
        below the scaled floor, whether or not the shape was measured: smooth across shapes,
        so the difference of two is a resource's cost and not two samples' noise."""
        with self._lock:
            self._refit()
            fit, scale = self._fit, self._floor_scale
        cost = mixed_step_cost(groups, self.device, self.kernel_calibration)
        return self._modelled(cost, fit, scale * cost.optimistic_s)

    @staticmethod
    def _modelled(cost: StepCost, fit: StepTimeFit | None, floor: float) -> float:
        if fit is None:
            return cost.estimate_s
        fitted = fit.overhead_s + fit.mem_scale * cost.memory_s + fit.cmp_scale * cost.compute_s
        return max(floor, fitted)

    def prefill_time(self, head: HeadProfile, tokens: float, measured: int) -> float:
        return self.prefill.seconds(head, tokens, measured)

    @property
    def floor_scale(self) -> float:
        """The lowest measured step time ÷ its analytic optimistic floor, at most 1."""
        with self._lock:
            return self._floor_scale
