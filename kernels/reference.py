"""Reference unembedding + sampler: materializes the b×V logits; the oracle for faster kernels.

Sampling order, per sampled row (the Hugging Face / vLLM convention):
1. logits / T;
2. top-k (0 = off): keep the k highest, ties broken towards the lowest token id;
3. top-p (1.0 = off): over the softmax renormalized after top-k, keep the smallest prefix of
   tokens by descending probability whose mass reaches p; the top-1 is always kept;
4. Gumbel-max: argmax(filtered + g) with g ~ Gumbel(0, 1) from `kernels.rng`, which draws
   exactly from softmax(filtered), i.e. the renormalized filtered distribution
   (https://arxiv.org/abs/1411.0030, Appendix; Gumbel 1954).

Greedy rows (T == 0) take argmax(logits), ties towards the lowest id. A row whose logits are
all -inf yields token 0 (and a NaN logprob). Logprobs are log_softmax of the raw logits
(T = 1, unfiltered) at the chosen id.
"""

from __future__ import annotations

import logging

import torch

from kernels import rng
from kernels.errors import ShapeMismatch
from kernels.sampling_params import SampleOutput, SamplingBatch

log = logging.getLogger(__name__)


def compute_logits(hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """hidden [b, d] @ weight [V, d]^T -> [b, V] float32, accumulated in float32."""
    if hidden.dim() != 2 or weight.dim() != 2:
        raise ShapeMismatch(
            f"hidden must be [b, d] and weight [V, d], got {tuple(hidden.shape)} and "
            f"{tuple(weight.shape)}"
        )
    if hidden.shape[1] != weight.shape[1]:
        raise ShapeMismatch(f"hidden has d={hidden.shape[1]} but weight has d={weight.shape[1]}")
    # Upcast first: a bf16 matmul would round the accumulator, not just the inputs.
    return hidden.to(torch.float32) @ weight.to(torch.float32).T


def _check_batch(batch: SamplingBatch, b: int) -> None:
    fields = ("temperature", "top_p", "top_k", "seed", "position")
    for name in fields:
        shape = tuple(getattr(batch, name).shape)
        if shape != (b,):
            raise ShapeMismatch(f"batch.{name} has shape {shape}, expected ({b},)")


def filter_mask(scaled: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Keep-mask [r, V] bool of top-k then top-p over temperature-scaled logits [r, V]."""
    v = scaled.shape[1]
    # Stable sort so that equal logits rank by ascending id.
    sorted_vals, order = torch.sort(scaled, dim=-1, descending=True, stable=True)  # [r, V]
    rank = torch.arange(v, device=scaled.device)[None, :]  # [1, V]
    keep_k = (top_k[:, None] <= 0) | (rank < top_k[:, None])  # [r, V], in sorted order
    # float64 for the cumulative mass: a float32 running sum over 262k terms drifts by ~1e-4,
    # enough to move the nucleus boundary.
    masked = sorted_vals.to(torch.float64).masked_fill(~keep_k, float("-inf"))
    probs = torch.softmax(masked, dim=-1)  # [r, V]
    mass_before = torch.cumsum(probs, dim=-1) - probs  # exclusive prefix sum
    keep_p = mass_before < top_p.to(torch.float64)[:, None]  # rank 0 always: 0 < p
    keep_sorted = keep_k & keep_p
    return torch.zeros_like(keep_sorted).scatter(1, order, keep_sorted)


def _sample_rows(logits: torch.Tensor, batch: SamplingBatch, rows: torch.Tensor) -> torch.Tensor:
    """Gumbel-max over the filtered logits of the given rows -> [len(rows)] int64."""
    dev, v = logits.device, logits.shape[1]
    temperature = batch.temperature.to(dev, torch.float32)[rows]  # [r]
    top_k, top_p = batch.top_k.to(dev)[rows], batch.top_p.to(dev)[rows]  # [r]
    scaled = logits[rows] / temperature[:, None]  # [r, V]
    if bool(((top_k > 0) & (top_k < v)).any() or (top_p < 1.0).any()):
        scaled = scaled.masked_fill(~filter_mask(scaled, top_k, top_p), float("-inf"))
    noise = rng.gumbel(batch.seed.to(dev)[rows], batch.position.to(dev)[rows], v)  # [r, V]
    return torch.argmax(scaled + noise, dim=-1)


def unembed_and_sample(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    batch: SamplingBatch,
    bias: torch.Tensor | None = None,
) -> SampleOutput:
    """Sample one token per row of hidden [b, d] against the head weight [V, d].

    bias: optional additive logit bias or mask (-inf bans a token), [V] or [b, V].
    """
    logits = compute_logits(hidden, weight)  # [b, V] fp32
    if bias is not None:
        logits = logits + bias.to(logits.device, torch.float32)
    return sample_from_logits(logits, batch)


def sample_from_logits(logits: torch.Tensor, batch: SamplingBatch) -> SampleOutput:
    """The sampler half of the reference: logits [b, V] fp32 -> one token per row."""
    b = logits.shape[0]
    _check_batch(batch, b)
    # torch.argmax returns the first maximal index: ties go to the lowest id.
    token_ids = torch.argmax(logits, dim=-1)  # [b]; kept as is for greedy rows
    sampled_rows = torch.nonzero(batch.temperature.to(logits.device) > 0).squeeze(1)  # [r]
    if sampled_rows.numel() > 0:
        token_ids[sampled_rows] = _sample_rows(logits, batch, sampled_rows)
    logprobs = None
    if batch.want_logprobs:
        logprobs = torch.log_softmax(logits, dim=-1).gather(1, token_ids[:, None]).squeeze(1)
    return SampleOutput(token_ids=token_ids, logprobs=logprobs)
