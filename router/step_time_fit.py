"""Calibrated step times: fit the cost model's efficiencies to measured engine steps.

Each measured decode step gives its head groups and its wall time t. The model explains it as

    t ≈ c0 + c_mem · memory_s + c_cmp · compute_s

where memory_s and compute_s are the analytic times of the step's resources (router.cost):
1/c_mem and 1/c_cmp are the achieved fractions of peak bandwidth and FLOP/s, c0 the fixed
per-step overhead (host, launches, Python). The three coefficients are fitted by least
squares, clamped to >= 0, once enough distinct shapes are measured. A shape measured before
(same heads, batch, context bucket) uses its own smoothed time; a shape never measured uses
the fit, or the analytic floors' midpoint until there is a fit. A fitted time is never below
the optimistic floor.
"""

from __future__ import annotations

import logging
import math
import threading
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from kernels.crossover_calibration import CrossoverCalibration
from kernels.devices import DeviceSpec
from router.cost import Group, mixed_step_cost

log = logging.getLogger(__name__)

MIN_FIT_SAMPLES = 8
MAX_SAMPLES = 2048
EWMA = 0.2  # weight of a new measurement in a shape's smoothed time


@dataclass(frozen=True, slots=True)
class StepSample:
    """One measured engine step: head name -> (batch, mean context tokens), and its time."""

    groups: tuple[tuple[str, int, float], ...]
    seconds: float


def _shape_key(groups: Iterable[Group]) -> tuple[tuple[str, int, int], ...]:
    # Context in power-of-two buckets: steps a few tokens apart share one entry.
    return tuple(sorted((g.head.name, g.batch, max(0, math.ceil(math.log2(g.ctx_tokens + 1))))
                        for g in groups))


def _solve3(a: list[list[float]], b: list[float]) -> list[float] | None:
    """Gaussian elimination with partial pivoting on a 3×3 system; None when singular."""
    m = [row[:] + [rhs] for row, rhs in zip(a, b, strict=True)]
    for col in range(3):
        pivot = max(range(col, 3), key=lambda r: abs(m[r][col]))
        if abs(m[pivot][col]) < 1e-30:
            return None
        m[col], m[pivot] = m[pivot], m[col]
        for r in range(3):
            if r != col:
                f = m[r][col] / m[col][col]
                m[r] = [x - f * y for x, y in zip(m[r], m[col], strict=True)]
    return [m[i][3] / m[i][i] for i in range(3)]


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
        self._dirty = False
        self._recorded = 0  # samples accepted so far (the deque keeps the last MAX_SAMPLES)

    @property
    def sample_count(self) -> int:
        return self._recorded

    @property
    def fit(self) -> StepTimeFit | None:
        with self._lock:
            self._refit()
            return self._fit

    def record(self, sample: StepSample) -> None:
        groups = [Group(self._heads[name], b, ctx) for name, b, ctx in sample.groups
                  if name in self._heads and b > 0]
        if not groups or sample.seconds <= 0:
            return
        cost = mixed_step_cost(groups, self.device, self.kernel_calibration)
        key = _shape_key(groups)
        with self._lock:
            old = self._shapes.get(key)
            self._shapes[key] = sample.seconds if old is None else (
                (1 - EWMA) * old + EWMA * sample.seconds)
            self._samples.append((cost.memory_s, cost.compute_s, sample.seconds))
            self._recorded += 1
            self._dirty = True

    def _refit(self) -> None:
        # Callers hold the lock.
        if not self._dirty or len(self._samples) < MIN_FIT_SAMPLES:
            return
        self._dirty = False
        # Relative least squares (each row ÷ t): a 10 µs step counts as much as a 10 ms one.
        ata = [[0.0] * 3 for _ in range(3)]
        atb = [0.0] * 3
        for mem, cmp_, t in self._samples:
            row = (1.0 / t, mem / t, cmp_ / t)
            for i in range(3):
                atb[i] += row[i]
                for j in range(3):
                    ata[i][j] += row[i] * row[j]
        for i in range(3):  # a touch of ridge: shapes that never vary leave a column flat
            ata[i][i] += 1e-9 * (ata[i][i] or 1.0)
        coef = _solve3(ata, atb)
        if coef is None:
            return
        c0, cm, cc = (max(0.0, c) for c in coef)
        err = math.sqrt(sum(((c0 + cm * m + cc * c) / t - 1.0) ** 2 for m, c, t in self._samples)
                        / len(self._samples))
        self._fit = StepTimeFit(c0, cm, cc, len(self._samples), err)

    def step_time(self, groups: Sequence[Group]) -> float:
        key = _shape_key(groups)
        with self._lock:
            measured = self._shapes.get(key)
            if measured is not None:
                return measured
            self._refit()
            fit = self._fit
        cost = mixed_step_cost(groups, self.device, self.kernel_calibration)
        if fit is None:
            return cost.estimate_s
        fitted = fit.overhead_s + fit.mem_scale * cost.memory_s + fit.cmp_scale * cost.compute_s
        return max(cost.optimistic_s, fitted)
