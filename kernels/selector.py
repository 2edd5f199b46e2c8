"""Per-batch kernel choice: streaming (fused Triton on GPU, chunked torch on CPU) while the
head group is memory-bound, GEMM + sampler (split) past the crossover b* of
`kernels.crossover`, with hysteresis so a batch near b* does not flap. Pure Python.
"""

from __future__ import annotations

import logging
import math
import threading
from dataclasses import dataclass

from kernels.crossover import crossover_batch
from kernels.crossover_calibration import CrossoverCalibration
from kernels.devices import DeviceSpec

log = logging.getLogger(__name__)

KERNELS = ("fused", "chunked", "split")


@dataclass(frozen=True, slots=True)
class KernelChoice:
    kernel: str  # one of KERNELS
    b_star: float  # crossover group size; inf: streaming always wins
    source: str  # "calibration" | "roofline" | "split_only"


def stream_kernel(device: DeviceSpec) -> str:
    return "chunked" if device.is_cpu else "fused"


def choose(
    b: int, vocab: int, d: int, dtype: str, mode: str, device: DeviceSpec,
    calibration: CrossoverCalibration | None = None,
) -> KernelChoice:
    """Stateless choice: split iff b >= b*."""
    b_star, source = crossover_batch(vocab, d, dtype, mode, device, calibration)
    kernel = "split" if b >= b_star else stream_kernel(device)
    return KernelChoice(kernel, b_star, source)


class Selector:
    """`choose` with hysteresis: once on a path, stay until b leaves a band of ±h around b*.

    Thread-safe; crossovers are cached per (V, d, dtype, mode, device).
    """

    def __init__(self, calibration: CrossoverCalibration | None = None, hysteresis: float = 0.25):
        if not 0 <= hysteresis < 1:
            raise ValueError(f"hysteresis must be in [0, 1), got {hysteresis}")
        self.calibration = calibration
        self.hysteresis = hysteresis
        self._crossovers: dict[tuple, tuple[float, str]] = {}
        self._last: dict[tuple, str] = {}
        self._lock = threading.Lock()

    def choose(self, b: int, vocab: int, d: int, dtype: str, mode: str,
               device: DeviceSpec) -> KernelChoice:
        key = (vocab, d, dtype, mode, device.name)
        with self._lock:
            if key not in self._crossovers:
                self._crossovers[key] = crossover_batch(vocab, d, dtype, mode, device,
                                                        self.calibration)
            b_star, source = self._crossovers[key]
            kernel = self._pick(key, b, b_star, device)
            self._last[key] = kernel
        return KernelChoice(kernel, b_star, source)

    def _pick(self, key: tuple, b: int, b_star: float, device: DeviceSpec) -> str:
        stream = stream_kernel(device)
        if math.isinf(b_star) or b_star <= 1:
            return "split" if b >= b_star else stream
        prev = self._last.get(key)
        if prev == "split":
            return stream if b <= b_star * (1 - self.hysteresis) else "split"
        if prev == stream:
            return "split" if b >= b_star * (1 + self.hysteresis) else stream
        return "split" if b >= b_star else stream
