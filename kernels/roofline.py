"""Time model of the two unembedding paths on one device: max(bytes/BW, flops/F) + launches.

Pure Python (no torch). Per decode step of a head group of b rows against W[:V, d]:
- both paths read W once: V·d·s bytes, and do 2·b·V·d FLOPs;
- split also writes the b×V fp32 logits and its sampler reads them back (on CPU the torch
  sampler makes a few dozen passes over b×V int64 temporaries for the counter-keyed noise);
- streaming pads b to the tile height on GPU and runs its epilogue inside the tile loop, so it
  reaches a smaller fraction of peak FLOP/s than a GEMM.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kernels.devices import DeviceSpec

MODES = ("greedy", "sample", "top_k", "top_p")
SPLIT_ONLY = "split_only"  # a batch with an option that has no exact streaming form
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}

# Bytes moved per logit cell by the split path's sampler, after the GEMM wrote it (4 B).
# GPU: the Triton epilogue reads each cell once. CPU: the reference's torch sampler; the Gumbel
# hash is ~25 int64/float64 elementwise passes (read 8 + write 8 B each).
_SPLIT_CELL_BYTES_GPU = {"greedy": 8.0, "sample": 8.0, "top_k": 8.0, "top_p": 8.0}
_SPLIT_CELL_BYTES_CPU = {"greedy": 8.0, "sample": 400.0, "top_k": 450.0, "top_p": 450.0}
# The chunked CPU path runs the same torch ops, but on cache-resident chunks.
_CPU_CACHE_SPEEDUP = 4.0
_LAUNCH_S = {"gpu": 5e-6, "cpu": 10e-6}  # per kernel launch / torch op
_LAUNCHES = {"gpu": {"stream": 8, "split": 10}, "cpu": {"stream": 30, "split": 30}}
_TILE_B = 16  # smallest BLOCK_B of the fused kernel
_MAX_TILE_B = 64  # largest: past it the fused kernel re-reads W once per 64 rows


@dataclass(frozen=True, slots=True)
class Efficiency:
    """Fractions of the datasheet roofline each path reaches; calibration refits them."""

    bw: float = 0.8
    split_flops: float = 0.7
    stream_flops: float = 0.25  # BLOCK_B <= 64 tiles and the epilogue in the loop


@dataclass(frozen=True, slots=True)
class PathTimes:
    stream_s: float
    split_s: float


def path_times(
    b: int, vocab: int, d: int, dtype: str, mode: str, device: DeviceSpec,
    eff: Efficiency | None = None,
) -> PathTimes:
    e = eff or Efficiency()
    kind = "cpu" if device.is_cpu else "gpu"
    bw, flops = device.mem_bw * e.bw, device.peak_flops
    w_bytes = vocab * d * DTYPE_BYTES[dtype]
    cells = b * vocab
    cell_bytes = (_SPLIT_CELL_BYTES_CPU if kind == "cpu" else _SPLIT_CELL_BYTES_GPU).get(
        mode, 8.0)
    b_tile = b if kind == "cpu" else _TILE_B * math.ceil(b / _TILE_B)
    stream_cells = cells * cell_bytes / _CPU_CACHE_SPEEDUP / bw if kind == "cpu" else 0.0
    launch = _LAUNCH_S[kind]
    w_reads = 1 if kind == "cpu" else math.ceil(b / _MAX_TILE_B)
    stream = (max(w_reads * w_bytes / bw, 2 * b_tile * vocab * d / (flops * e.stream_flops))
              + stream_cells + _LAUNCHES[kind]["stream"] * launch)
    split = (max(w_bytes / bw, 2 * b * vocab * d / (flops * e.split_flops))
             + cells * (4 + cell_bytes) / bw + _LAUNCHES[kind]["split"] * launch)
    return PathTimes(stream, split)


def roofline_bound_s(b: int, vocab: int, d: int, dtype: str, device: DeviceSpec) -> float:
    """The unembedding's floor on this device: max(W bytes / BW, 2·b·V·d / peak)."""
    return max(vocab * d * DTYPE_BYTES[dtype] / device.mem_bw,
               2 * b * vocab * d / device.peak_flops)


def roofline_crossover(
    vocab: int, d: int, dtype: str, mode: str, device: DeviceSpec,
    eff: Efficiency | None = None, b_max: int = 4096,
) -> float:
    """Smallest b at which split is no slower than streaming; inf if none up to b_max."""
    if mode == SPLIT_ONLY:
        return 1.0
    for b in range(1, b_max + 1):
        t = path_times(b, vocab, d, dtype, mode, device, eff)
        if t.split_s <= t.stream_s:
            return float(b)
    return math.inf
