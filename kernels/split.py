"""Split path: one GEMM writes the b×V fp32 logits, then a sampler reads them.

On GPU the GEMM is cuBLAS with an fp32 output and the sampler is the fused kernel's epilogue
(kernels/triton_fused.py, FROM_LOGITS); on CPU both halves are the reference's.
"""

from __future__ import annotations

import logging

import torch

from kernels import reference
from kernels.packed_rows import PackedRows
from kernels.row_groups import row_bias
from kernels.sampling_params import SampleOutput, SamplingBatch

log = logging.getLogger(__name__)


def logits_fp32(hidden: torch.Tensor, weight: torch.Tensor,
                packed: PackedRows | None = None) -> torch.Tensor:
    """hidden [b, d] @ weight [V, d]^T -> [b, V] fp32 with fp32 accumulation; from `packed`
    (the same rows in oneDNN blocks) when given."""
    if packed is not None:
        return packed.logits(hidden)
    if hidden.is_cuda and hidden.dtype == weight.dtype == torch.bfloat16:
        # bf16 tensor-core GEMM, fp32 out: no fp32 copy of W and no bf16 rounding of logits.
        return torch.mm(hidden, weight.T, out_dtype=torch.float32)
    return reference.compute_logits(hidden, weight)


def unembed_and_sample(
    hidden: torch.Tensor, weight: torch.Tensor, batch: SamplingBatch,
    bias: torch.Tensor | None = None, packed: PackedRows | None = None,
) -> SampleOutput:
    """Same call and result as kernels.reference.unembed_and_sample; `bias` [V] or per row
    [b, Vb] with Vb <= V (kernels.row_groups.row_bias)."""
    logits = logits_fp32(hidden, weight, packed)  # [b, V], this call's own buffer
    bias2 = row_bias(bias, hidden.shape[0], weight.shape[0])
    if bias2 is not None:
        logits[:, :bias2.shape[1]] += bias2.to(logits.device)
    if logits.is_cuda:
        from kernels.triton_fused import sample_logits  # triton: GPU-only dependency here

        return sample_logits(logits, batch)
    return reference.sample_from_logits(logits, batch)
