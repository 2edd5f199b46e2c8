"""Which bytes a product of b rows reads: the source file's integer groups, or packed bf16.

While a product is memory-bound its time is the bytes it reads, and integer groups are about
half of bf16's (a Q8_0 row of 640 values: 680 bytes against 1280). Past a few rows the same
read is shared by the batch and the GEMM's arithmetic decides; there oneDNN's blocked bf16
kernels win. Where that crossover lies depends on the machine (AMX, AVX512-BF16, core
count), so `polyhead kernels calibrate` measures both at b = 1, 2, 3, ... (`sweep`) and
stores `int8_rows`, the largest b up to which int8 won at every size; the engine reads it
(`int8_rows`) for every product it packs.

Weights policies (`EngineConfig.weights`, POLYHEAD_WEIGHTS):
- `auto`: int8 for products of at most the calibrated rows, bf16 above (DEFAULT_INT8_ROWS
  where the machine has no calibration);
- `quantized`: int8 at every b (several passes of 4 rows for larger batches);
- `bf16`: never int8 (the checkpoint's int8 file is not loaded).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch loads with the sweep: the engine's config imports WEIGHTS
    from kernels.int_groups import IntGroups

WEIGHTS = ("auto", "quantized", "bf16")
# Uncalibrated: int8 only for one row, where the product is a pure stream of the weight on
# any machine (at b=1 the int8 GEMV read [262144, 640] 2.5x faster than oneDNN's bf16 on one
# Zen 4 core; the crossover there was b=3-4).
DEFAULT_INT8_ROWS = 1
EVERY_BATCH = 1 << 30
MARGIN = 0.03  # int8 must win by more than this (relative) to count
SWEEP_B = (1, 2, 3, 4, 6, 8, 12, 16)


def int8_rows(weights: str, calibrated: int | None) -> int:
    """Products of at most this many rows read integer groups, under policy `weights`."""
    if weights not in WEIGHTS:
        raise ValueError(f"weights {weights!r} not in {WEIGHTS}")
    if weights == "bf16":
        return 0
    if weights == "quantized":
        return EVERY_BATCH
    return DEFAULT_INT8_ROWS if calibrated is None else calibrated


def _median_s(fn: Callable[[], object], repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def random_groups(n: int, k: int, seed: int = 0) -> IntGroups:
    """A Q8_0-like [n, k] matrix: int8 values and fp16 scales of trained-embedding size."""
    import torch

    from kernels.int_groups import GROUP, IntGroups

    gen = torch.Generator().manual_seed(seed)
    values = torch.randint(-127, 128, (n, k), dtype=torch.int8, generator=gen)
    scales = (torch.rand(n, k // GROUP, generator=gen) * 1e-3 + 1e-4).half()
    return IntGroups(values, scales)


def sweep(n: int, k: int, provider: str = "torch", bs: Sequence[int] = SWEEP_B,
          repeats: int = 7) -> dict:
    """integer groups against the packed bf16 product (oneDNN, with the bf16 GEMV at one row)
    of an [n, k] weight at each b. -> the calibration entry: sizes, seconds, bytes read,
    and `int8_rows`."""
    import torch

    from kernels import onednn_gemm

    groups = random_groups(n, k)
    dense = groups.dequantize(torch.bfloat16)
    bf16 = onednn_gemm.pack(dense, provider)
    int8 = groups.product()
    t_int8, t_bf16 = [], []
    for b in bs:
        x = torch.randn(b, k, generator=torch.Generator().manual_seed(b)).to(torch.bfloat16)
        t_int8.append(_median_s(partial(int8, x), repeats))
        t_bf16.append(_median_s(partial(bf16, x), repeats))
    return {"shape": [n, k], "provider": provider, "b": list(bs), "t_int8_s": t_int8,
            "t_bf16_s": t_bf16, "int8_bytes": groups.nbytes, "bf16_bytes": dense.nbytes,
            "int8_rows": crossover(list(bs), t_int8, t_bf16)}


def crossover(bs: list[int], t_int8: list[float], t_bf16: list[float]) -> int:
    """The largest b up to which int8 beat bf16 by MARGIN at every size; 0 if never."""
    rows = 0
    for b, ti, tb in zip(bs, t_int8, t_bf16, strict=True):
        if ti >= tb * (1 - MARGIN):
            break
        rows = b
    return rows
