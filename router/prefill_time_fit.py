"""Calibrated prefill times: a request's prompt priced as the engine's prefill steps took.

Each measured prefill step gives, per head, the prompt tokens it computed (past the prefix
cache) and the prompt positions the measured quality control scored, and its wall time t.
The model explains it as

    t ≈ c0 + c_mem · memory_s + c_cmp · compute_s + c_msr · measure_s

with the analytic seconds of router.cost.PrefillCost, summed over the step's prompts: the
unembedding read for the last position, the backbone's 2·N FLOP per token, and the
measurement's native product. The fit is router.nonneg_fit's. A reading's measurement is its
own column because it is one [k, d] × [V_native, d] product, memory-bound below a few dozen
positions and compute-bound past them, with another efficiency than the backbone's: on the
demo (AMD EPYC, 2 threads) a 12-position measurement took 45 ms and the rest of its 25-token
prefill 47 ms, where the analytic model gave 45 ms for the two together. Until a measured
prompt is seen, the measurement is priced at its analytic time.

Until MIN_FIT_SAMPLES prefills are measured, or for a shape the fit cannot see, the price is
the analytic one. A fitted price is never below the analytic one scaled by the lowest
measured ÷ analytic ratio seen (at most 1), as the decode fit's floor; once there is a fit, a
sample moves it as if it were at most OUTLIER× off what it predicts.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

from kernels.devices import DeviceSpec
from router.cost import PrefillCost, prefill_cost
from router.nonneg_fit import fit_nonneg
from router.profiles import HeadProfile

MIN_FIT_SAMPLES = 8
MAX_SAMPLES = 512
OUTLIER = 2.0  # as the decode fit's


@dataclass(frozen=True, slots=True)
class PrefillSample:
    """One measured prefill step: (head, prompt tokens computed, positions measured) per
    head, and its time."""

    prompts: tuple[tuple[str, int, int], ...]
    seconds: float


@dataclass(frozen=True, slots=True)
class PrefillTimeFit:
    overhead_s: float
    mem_scale: float  # 1 / achieved fraction of peak bandwidth on the unembedding read
    cmp_scale: float  # 1 / achieved fraction of peak FLOP/s on the backbone
    measure_scale: float  # measured ÷ analytic seconds of the prompt measurement
    samples: int
    rms_rel_error: float

    def seconds(self, cost: PrefillCost) -> float:
        return (self.overhead_s + self.mem_scale * cost.memory_s
                + self.cmp_scale * cost.compute_s + self.measure_scale * cost.measure_s)


class FittedPrefillTime:
    """Prefill seconds per prompt, learnt from measured prefill steps; thread-safe."""

    def __init__(self, device: DeviceSpec, heads: Iterable[HeadProfile] = ()) -> None:
        self.device = device
        self._heads = {h.name: h for h in heads}
        self._lock = threading.Lock()
        self._samples: deque[tuple[tuple[float, float, float], float]] = deque(
            maxlen=MAX_SAMPLES)
        self._fit: PrefillTimeFit | None = None
        self._floor_scale = 1.0
        self._dirty = False
        self._measured = 0  # samples with a prompt measurement among them

    def record(self, sample: PrefillSample) -> None:
        costs = [prefill_cost(self._heads[h], self.device, tokens, measured)
                 for h, tokens, measured in sample.prompts if h in self._heads and tokens > 0]
        if not costs or sample.seconds <= 0:
            return
        columns = (sum(c.memory_s for c in costs), sum(c.compute_s for c in costs),
                   sum(c.measure_s for c in costs))
        analytic = sum(c.analytic_s for c in costs)
        seconds = sample.seconds
        with self._lock:
            if self._fit is not None:
                # A first prefill at a new length can take 10-50x its time (measured on the
                # demo: 2.6 s for 157 tokens, 0.12 s the next time); it moves the fit as if
                # it were at most OUTLIER off.
                expected = self._fit.seconds(PrefillCost(*columns))
                seconds = min(max(seconds, expected / OUTLIER), expected * OUTLIER)
            self._samples.append((columns, seconds))
            self._floor_scale = min(self._floor_scale, sample.seconds / analytic)
            self._measured += columns[2] > 0
            self._dirty = True

    @property
    def fit(self) -> PrefillTimeFit | None:
        with self._lock:
            if self._dirty and len(self._samples) >= MIN_FIT_SAMPLES:
                self._dirty = False
                fitted = fit_nonneg(list(self._samples))
                if fitted is not None:
                    (c0, cm, cc, cs), err = fitted
                    self._fit = PrefillTimeFit(c0, cm, cc, cs, len(self._samples), err)
            return self._fit

    def seconds(self, head: HeadProfile, tokens: float, measured: int) -> float:
        """One prompt of `tokens` tokens, `measured` of its positions measured, on `head`."""
        cost = prefill_cost(head, self.device, tokens, measured)
        fit = self.fit
        if fit is None:
            return cost.analytic_s
        with self._lock:
            floor, seen = self._floor_scale * cost.analytic_s, self._measured > 0
        fitted = fit.seconds(cost) if seen else fit.seconds(
            PrefillCost(cost.memory_s, cost.compute_s, 0.0)) + cost.measure_s
        return max(floor, fitted)
