"""This machine's roofline, measured: memory bandwidth and the dense GEMM peak of the dtype the
engine runs, as the packed oneDNN products the CPU engine uses reach them.

`kernels.devices.detect_cpu` guesses both from /proc/cpuinfo (FLOP per cycle by instruction
set, bandwidth by core count); `polyhead kernels calibrate` replaces the guess with these
figures and stores them in the calibration file, which the engine's selector and the router
then read (`kernels.crossover_calibration.CrossoverCalibration.roofline`).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import torch

from kernels import huge_pages, onednn_gemm

log = logging.getLogger(__name__)

_READ_BYTES = 512 << 20  # far past any last-level cache
_GEMM = (512, 16384, 640)  # b, V, d: compute-bound for every dtype here (b FLOP/B >= 256)


@dataclass(frozen=True, slots=True)
class MeasuredRoofline:
    mem_bw: float  # B/s, a streaming read on torch's current threads
    peak_flops: float  # FLOP/s of a packed GEMM in `dtype`, the same threads
    dtype: str
    threads: int

    def to_json(self) -> dict[str, object]:
        return {"mem_bw": self.mem_bw, "peak_flops": self.peak_flops, "dtype": self.dtype,
                "threads": self.threads}


def _best(fn: object, repeats: int) -> float:
    assert callable(fn)
    fn()  # warm-up: page faults, oneDNN's kernel selection
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def read_bandwidth(repeats: int = 3) -> float:
    """B/s of a sum over 512 MiB of fp32: the rate a memory-bound unembedding reads at. On
    huge pages where the kernel has them, as the CPU engine keeps its packed weights: 4 KiB
    pages read about 15% slower here, which would put the bound below what the engine
    reaches."""
    before = huge_pages.mappings()
    x = torch.ones(_READ_BYTES // 4)
    huge_pages.back(huge_pages.mappings() - before)
    return _READ_BYTES / _best(lambda: x.sum(), repeats)


def gemm_peak(dtype: torch.dtype, repeats: int = 3) -> float:
    """FLOP/s of [512, 640] x [16384, 640]^T through a packed oneDNN product in `dtype` from
    the provider the CPU engine takes (kernels.onednn_gemm); a plain matmul where the CPU has
    no oneDNN path for the dtype."""
    b, v, d = _GEMM
    g = torch.Generator().manual_seed(0)
    h = torch.randn(b, d, generator=g).to(dtype)
    w = torch.randn(v, d, generator=g).to(dtype)
    packable = torch.backends.mkldnn.is_available() and (
        dtype == torch.float32 or (dtype == torch.bfloat16
                                   and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())))
    if packable:
        product = onednn_gemm.pack(w, onednn_gemm.resolve("auto", dtype))
        seconds = _best(lambda: product(h), repeats)
    else:
        seconds = _best(lambda: h @ w.T, repeats)
    return 2 * b * v * d / seconds


def measure(dtype: torch.dtype) -> MeasuredRoofline:
    out = MeasuredRoofline(read_bandwidth(), gemm_peak(dtype), str(dtype).removeprefix("torch."),
                           torch.get_num_threads())
    log.info("measured roofline: %.1f GB/s read, %.2f TFLOP/s %s on %d thread(s)",
             out.mem_bw / 1e9, out.peak_flops / 1e12, out.dtype, out.threads)
    return out
