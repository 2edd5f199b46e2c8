"""Nested unembedding + sampling: one pass over the largest live head for a mixed-head batch.

Nested heads are prefixes of one matrix: head V reads rows [0, V) of W [Vmax, d]. A step
whose rows belong to heads V_1 < … < V_k therefore needs W[:Vmax] once, not once per head:
each row block of W is multiplied by the hidden states of the rows whose V_i covers it, and
row i's softmax, LSE, top-k / top-p and Gumbel-max see its own first V_i columns only.

The result is the per-head op's (kernels.reference.unembed_and_sample on weight[:V_i]) row by
row: the counter-keyed noise depends on (seed, position, token id) alone (kernels/rng.py), so
a row draws the same noise whatever else shares its step. Logits agree to fp32 rounding, as
every other pair of paths does (kernels.streaming.near_tie_tolerance).

Rows are reordered by V descending, so the rows that see a column are a prefix of the batch:
- split: one GEMM per segment [V_{j-1}, V_j) (per oneDNN block with packed rows) over the
  rows that cover it, into one [B, Vmax] fp32 buffer; then each head's rows go through the
  split path's sampler on their own [b_h, V_h] slice, so sampling is exactly per head;
- chunked: the CPU streaming pass, chunks multiplied by the covering rows only;
- fused: the Triton kernel with a per-row vocabulary limit.
FLOPs are Σ_h 2·b_h·V_h·d, as per head; W's bytes are read once, Vmax·d·s.
"""

from __future__ import annotations

import logging

import torch

from kernels import chunked, reference, split
from kernels.errors import ShapeMismatch
from kernels.packed_rows import PackedRows
from kernels.row_groups import (
    bias_at,
    bias_columns,
    descending_order,
    reference_per_head,
    take_rows,
)
from kernels.sampling_params import SampleOutput, SamplingBatch
from kernels.streaming import finish, stream_spec

log = logging.getLogger(__name__)

KERNELS = ("split", "chunked", "fused")


def unembed_and_sample(
    kernel: str, hidden: torch.Tensor, weight: torch.Tensor, row_vocab: torch.Tensor,
    batch: SamplingBatch, bias: torch.Tensor | None = None, packed: PackedRows | None = None,
    chunk: int | None = None,
) -> SampleOutput:
    """hidden [B, d] (each row already through its head's hidden transform); weight [Vmax, d],
    the largest head's rows; row_vocab [B] int64, each row's V (<= Vmax); bias [B, Vb] fp32
    or None, Vb <= Vmax, zero at columns >= Vb and ignored past a row's V; packed: weight's
    rows in oneDNN blocks (CPU)."""
    _check(hidden, weight, row_vocab, batch, bias, packed)
    if kernel == "fused":
        from kernels import triton_fused  # imports triton: only on devices that run it

        full = None if bias is None else bias_columns(bias, weight.shape[0])
        return triton_fused.unembed_and_sample(hidden, weight, batch, full,
                                               row_vocab=row_vocab.to(hidden.device))
    if kernel not in KERNELS:
        raise ValueError(f"nested kernel {kernel!r} not in {KERNELS}")
    perm, inverse = descending_order(row_vocab.to(hidden.device))
    limits = row_vocab.to(hidden.device, torch.int64)[perm]
    h, sub = hidden[perm], take_rows(batch, perm.cpu())
    b2 = None if bias is None else bias.to(torch.float32)[perm]
    if kernel == "split":
        out = _split(h, weight, limits.tolist(), sub, b2, packed)
    else:
        out = _chunked(h, weight, limits, sub, b2, packed, chunk or chunked.default_chunk(
            hidden.shape[0]))
    lp = None if out.logprobs is None else out.logprobs[inverse]
    return SampleOutput(out.token_ids[inverse], lp)


def segment_logits(h: torch.Tensor, weight: torch.Tensor, row_vocab: list[int],
                   packed: PackedRows | None = None) -> torch.Tensor:
    """[B, Vmax] fp32 logits of rows sorted by V descending; row i's cells past row_vocab[i]
    are left unwritten (never read). Each segment of W is read once."""
    b, vmax = h.shape[0], row_vocab[0]
    out = torch.empty(b, vmax, dtype=torch.float32, device=h.device)
    if packed is not None:
        hp = h.to(packed.dtype)  # [B, d] in the rows' dtype, cast once
        for j, size in enumerate(packed.sizes):
            lo = j * packed.block_rows
            n = sum(v > lo for v in row_vocab)
            if n == 0 or lo >= vmax:
                break
            hi = min(lo + size, vmax)
            out[:n, lo:hi] = packed.block_logits(hp[:n], j)[:, :hi - lo]
        return out
    lo = 0
    for v in sorted(set(row_vocab)):
        n = sum(x >= v for x in row_vocab)  # the rows whose head covers [lo, v)
        out[:n, lo:v] = split.logits_fp32(h[:n], weight[lo:v])
        lo = v
    return out


def _split(h: torch.Tensor, weight: torch.Tensor, row_vocab: list[int], batch: SamplingBatch,
           bias: torch.Tensor | None, packed: PackedRows | None) -> SampleOutput:
    logits = segment_logits(h, weight, row_vocab, packed)  # [B, Vmax]
    tokens = torch.empty(h.shape[0], dtype=torch.int64, device=h.device)
    logprobs = torch.empty(h.shape[0], device=h.device) if batch.want_logprobs else None
    lo = 0
    while lo < len(row_vocab):  # one head per run of equal V: its rows are contiguous
        v = row_vocab[lo]
        hi = lo + row_vocab[lo:].count(v)
        sl = logits[lo:hi, :v]
        if bias is not None:  # in place: logits is this call's own buffer
            w = min(v, bias.shape[1])
            logits[lo:hi, :w] += bias[lo:hi, :w]
        out = _sample(sl, take_rows(batch, torch.arange(lo, hi)))
        tokens[lo:hi] = out.token_ids
        if logprobs is not None and out.logprobs is not None:
            logprobs[lo:hi] = out.logprobs
        lo = hi
    return SampleOutput(tokens, logprobs)


def _sample(logits: torch.Tensor, batch: SamplingBatch) -> SampleOutput:
    # The split path's sampler, as kernels/split.py runs it for one head.
    if logits.is_cuda:
        from kernels.triton_fused import sample_logits  # triton: GPU-only dependency here

        return sample_logits(logits, batch)
    return reference.sample_from_logits(logits.contiguous(), batch)


def _chunked(h: torch.Tensor, weight: torch.Tensor, limits: torch.Tensor,
             batch: SamplingBatch, bias: torch.Tensor | None, packed: PackedRows | None,
             chunk: int) -> SampleOutput:
    vmax = int(limits[0])
    w = weight[:vmax]
    if packed is not None and packed.vocab != vmax:
        raise ShapeMismatch(f"packed rows have V={packed.vocab}, the largest row has V={vmax}")
    spec = stream_spec(batch, limits)
    h32 = h.to(torch.float32)
    b2 = None if bias is None else bias[:, :vmax]
    p = chunked.chunk_partials(h32, w, batch, spec, b2, chunk, packed, row_vocab=limits.tolist())

    def logit_at(tokens: torch.Tensor) -> torch.Tensor:
        out = (h32 * w[tokens].to(torch.float32)).sum(dim=1)
        return out if b2 is None else out + bias_at(b2, tokens)

    def fallback(rows: torch.Tensor) -> SampleOutput:
        return reference_per_head(h, w, batch, b2, limits, rows)

    return finish(p, spec, batch, limits, logit_at, fallback)


def _check(hidden: torch.Tensor, weight: torch.Tensor, row_vocab: torch.Tensor,
           batch: SamplingBatch, bias: torch.Tensor | None, packed: PackedRows | None) -> None:
    if hidden.dim() != 2 or weight.dim() != 2 or hidden.shape[1] != weight.shape[1]:
        raise ShapeMismatch(f"hidden {tuple(hidden.shape)} vs weight {tuple(weight.shape)}")
    b = hidden.shape[0]
    if len(batch) != b or tuple(row_vocab.shape) != (b,):
        raise ShapeMismatch(f"batch has {len(batch)} rows, row_vocab {tuple(row_vocab.shape)}, "
                            f"hidden {b}")
    if b == 0:
        raise ShapeMismatch("a nested pass needs at least one row")
    lo, hi = int(row_vocab.min()), int(row_vocab.max())
    if lo < 1 or hi > weight.shape[0]:
        raise ShapeMismatch(f"row_vocab in [{lo}, {hi}], weight has {weight.shape[0]} rows")
    if bias is not None and (bias.dim() != 2 or bias.shape[0] != b
                             or not 1 <= bias.shape[1] <= weight.shape[0]):
        raise ShapeMismatch(f"bias must be [{b}, <= {weight.shape[0]}], got {tuple(bias.shape)}")
    if packed is not None and packed.vocab != hi:
        raise ShapeMismatch(f"packed rows have V={packed.vocab}, the largest row has V={hi}")
