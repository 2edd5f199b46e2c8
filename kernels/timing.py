"""Timing for benchmarks and calibration: the median over repeats, never from a warm cache.

Each repeat runs against the next of several weight copies whose total size exceeds the
last-level cache, so a W smaller than the LLC is still read from memory.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable

import torch

from kernels.row_params import RowParams
from kernels.sampling_params import SamplingBatch

log = logging.getLogger(__name__)

_LLC_BYTES = {"cpu": 64 << 20, "cuda": 128 << 20}  # generous: 2× typical L3 / L2
_MAX_COPIES = 8
_SEED = 1234


def weight_copies(
    vocab: int, d: int, dtype: torch.dtype, device: torch.device
) -> list[torch.Tensor]:
    """Enough distinct [V, d] matrices to rotate through so repeats miss the LLC."""
    nbytes = vocab * d * torch.finfo(dtype).bits // 8
    n = min(_MAX_COPIES, 1 + _LLC_BYTES.get(device.type, 64 << 20) // max(nbytes, 1))
    gen = torch.Generator().manual_seed(_SEED)
    base = (torch.randn(vocab, d, generator=gen) / d**0.5).to(dtype)
    return [(base if i == 0 else base.roll(i, dims=0)).to(device) for i in range(n)]


def hidden_states(b: int, d: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    gen = torch.Generator().manual_seed(_SEED + b)
    return torch.randn(b, d, generator=gen).mul(2.0).to(dtype).to(device)


def mode_batch(mode: str, b: int) -> SamplingBatch:
    """A homogeneous head group in one sampling mode (kernels.roofline.MODES)."""
    row = {"greedy": RowParams(temperature=0.0), "sample": RowParams(temperature=0.8),
           "top_k": RowParams(temperature=0.8, top_k=50),
           "top_p": RowParams(temperature=0.8, top_p=0.9)}[mode]
    rows = [RowParams(row.temperature, row.top_p, row.top_k, seed=i) for i in range(b)]
    return SamplingBatch.from_rows(rows, [17] * b)


def median_time(
    fn: Callable[[torch.Tensor], object], weights: list[torch.Tensor], repeats: int,
    warmup: int = 1,
) -> float:
    """Median seconds of fn(W) over `repeats` calls, rotating through `weights`."""
    cuda = weights[0].is_cuda
    for i in range(warmup):
        fn(weights[i % len(weights)])
    times = []
    for i in range(repeats):
        w = weights[(i + warmup) % len(weights)]
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn(w)
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)
