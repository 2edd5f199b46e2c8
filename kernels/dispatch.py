"""Runs a selector KernelChoice: the one entry point the engine calls per head group."""

from __future__ import annotations

import logging

import torch

from kernels import chunked, split
from kernels.devices import DeviceSpec, detect_cpu, device_for_gpu_name
from kernels.packed_rows import PackedRows
from kernels.roofline import SPLIT_ONLY
from kernels.sampling_params import SampleOutput, SamplingBatch
from kernels.selector import KernelChoice
from kernels.streaming import K_MAX

log = logging.getLogger(__name__)


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def batch_mode(batch: SamplingBatch, vocab: int | torch.Tensor) -> str:
    """The sampling mode of a head group, as the selector and calibration key it. `vocab`: V,
    or per row [b] (a nested pass, where each row's top-k is judged against its own head)."""
    sampled = batch.temperature > 0
    if not bool(sampled.any()):
        return "greedy"
    k_on = sampled & (batch.top_k > 0) & (batch.top_k < vocab)
    if bool((k_on & (batch.top_k > K_MAX)).any()):
        return SPLIT_ONLY
    if bool((sampled & ~k_on & (batch.top_p < 1.0)).any()):
        return "top_p"
    return "top_k" if bool(k_on.any()) else "sample"


def device_spec(device: torch.device) -> DeviceSpec:
    if device.type == "cuda":
        return device_for_gpu_name(torch.cuda.get_device_name(device))
    return detect_cpu()


def run_plan(
    plan: KernelChoice, hidden: torch.Tensor, weight: torch.Tensor, batch: SamplingBatch,
    bias: torch.Tensor | None = None, packed: PackedRows | None = None,
) -> SampleOutput:
    """`packed`: weight's rows in oneDNN blocks, for the CPU kernels (ignored on GPU)."""
    if plan.kernel == "split":
        return split.unembed_and_sample(hidden, weight, batch, bias, packed)
    if plan.kernel == "chunked":
        return chunked.unembed_and_sample(hidden, weight, batch, bias, packed=packed)
    from kernels import triton_fused  # imports triton: only on devices that run it

    return triton_fused.unembed_and_sample(hidden, weight, batch, bias)
