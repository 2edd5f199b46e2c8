"""`polyhead kernels calibrate`: sweep b per head shape and mode, find the crossover b*.

For each (V, d, dtype, mode), time the streaming path and the split path at b = 1, 2, 4, …,
b_max (median over repeats, rotating weight copies past the LLC) and record b*. The sweep of
one shape stops early once split has won `stop_after` sizes in a row past b = 16 (compute-bound
from there on). Split "wins" only by more than MARGIN: a tie within timing noise keeps the
streaming path, which is exact and allocates nothing. On a CPU both paths read the rows from
oneDNN's packed blocks, as the engine does, and the roofline is this machine's, measured first
(kernels.machine: bandwidth and the packed GEMM peak) and stored in the calibration.
Efficiencies (fractions of that roofline reached) are fitted over all points.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch

from kernels import chunked, machine, split
from kernels.crossover_calibration import CrossoverCalibration, crossover_from_sweep, entry_key
from kernels.devices import DeviceSpec
from kernels.dispatch import dtype_name
from kernels.packed_rows import PackedRows, RowPacker, packing_supported
from kernels.roofline import DTYPE_BYTES
from kernels.sampling_params import SampleOutput, SamplingBatch
from kernels.selector import stream_kernel
from kernels.timing import hidden_states, median_time, mode_batch, weight_copies

log = logging.getLogger(__name__)

MARGIN = 0.03  # relative
MIN_SWEEP_B = 16


@dataclass(frozen=True, slots=True)
class Shape:
    name: str  # head name, for reports
    vocab: int
    d: int


def _stream_fn(device: DeviceSpec) -> Callable[..., SampleOutput]:
    if device.is_cpu:
        return chunked.unembed_and_sample
    from kernels import triton_fused  # GPU only

    return triton_fused.unembed_and_sample


def _call(fn: Callable[..., SampleOutput], hidden: torch.Tensor, batch: SamplingBatch,
          packed: dict[int, PackedRows], weight: torch.Tensor) -> SampleOutput:
    rows = packed.get(weight.data_ptr())
    return fn(hidden, weight, batch) if rows is None else fn(hidden, weight, batch, packed=rows)


def _packed(weights: list[torch.Tensor]) -> dict[int, PackedRows]:
    """Each weight copy in oneDNN blocks, where the CPU engine packs them (the kernels it runs
    read those); empty on a GPU or where the dtype has no packed path."""
    if not packing_supported(weights[0]):
        return {}
    packer = RowPacker()
    return {w.data_ptr(): packer.pack(w) for w in weights}


def calibrate(
    shapes: list[Shape], dtypes: list[torch.dtype], modes: list[str], device: DeviceSpec,
    torch_device: torch.device, b_max: int = 512, repeats: int = 5, stop_after: int = 2,
) -> CrossoverCalibration:
    cal = CrossoverCalibration(device.name, meta={
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "torch": torch.__version__,
        "threads": torch.get_num_threads(), "repeats": repeats,
        "stream_kernel": stream_kernel(device), "heads": {s.name: s.vocab for s in shapes},
    })
    if device.is_cpu:  # this machine's bandwidth and GEMM peak, in the first dtype swept
        measured = machine.measure(dtypes[0])
        cal.meta["roofline"] = measured.to_json()
        device = cal.roofline(device)
    from kernels import int_groups, precision  # the sweep needs the fused CPU ops

    if device.is_cpu and int_groups.gemv_available():
        # Which bytes a product of b rows should read, on the largest head's shape.
        widest = max(shapes, key=lambda s: s.vocab)
        cal.meta["int8"] = precision.sweep(widest.vocab, widest.d, repeats=repeats)
    stream = _stream_fn(device)
    bs_all = [1 << i for i in range(int(math.log2(b_max)) + 1)]
    eff = {"bw": 0.0, "split_flops": 0.0, "stream_flops": 0.0}
    for shape in shapes:
        for dtype in dtypes:
            weights = weight_copies(shape.vocab, shape.d, dtype, torch_device)
            packed = _packed(weights)
            w_bytes = shape.vocab * shape.d * DTYPE_BYTES[dtype_name(dtype)]
            for mode in modes:
                bs, t_stream, t_split = [], [], []
                streak = 0
                for b in bs_all:
                    h = hidden_states(b, shape.d, dtype, torch_device)
                    batch = mode_batch(mode, b)
                    ts = median_time(partial(_call, stream, h, batch, packed), weights, repeats)
                    tp = median_time(partial(_call, split.unembed_and_sample, h, batch, packed),
                                     weights, repeats)
                    bs.append(b)
                    t_stream.append(ts)
                    t_split.append(tp)
                    flops = 2 * b * shape.vocab * shape.d
                    eff["bw"] = max(eff["bw"], w_bytes / ts / device.mem_bw)
                    eff["stream_flops"] = max(eff["stream_flops"], flops / ts / device.peak_flops)
                    eff["split_flops"] = max(eff["split_flops"], flops / tp / device.peak_flops)
                    streak = streak + 1 if tp < ts * (1 - MARGIN) else 0
                    log.info("%s %s %s b=%d: stream %.2f ms, split %.2f ms", shape.name,
                             dtype_name(dtype), mode, b, ts * 1e3, tp * 1e3)
                    if streak >= stop_after and b >= MIN_SWEEP_B:
                        break
                b_star = crossover_from_sweep(bs, t_stream, [t / (1 - MARGIN) for t in t_split])
                cal.entries[entry_key(shape.vocab, shape.d, dtype_name(dtype), mode)] = {
                    "head": shape.name, "V": shape.vocab, "d": shape.d,
                    "dtype": dtype_name(dtype), "mode": mode, "b": bs,
                    "t_stream_s": t_stream, "t_split_s": t_split,
                    "b_star": None if math.isinf(b_star) else b_star,
                }
    cal.efficiency = eff
    return cal
