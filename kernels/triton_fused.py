"""Fused streaming unembedding + sampling in Triton: one pass over W[:V], never b×V logits.

Stage 1 (`_stage1`, grid = (V tiles, b blocks)): logits tile = h[b, d] @ W[tile, d]^T with
tl.dot, b padded to BLOCK_B ∈ {16, 32, 64}, fp32 accumulation. The epilogue applies the bias,
1/T and Gumbel noise from the counter hash of kernels/rng.py (splitmix64 keyed by seed,
position, token id; https://prng.di.unimi.it/splitmix64.c), and writes per-tile partials:
(max, argmax) of the score, online-LSE (m, s) of ℓ and of ℓ/T, and the tile's top-K
candidates as packed (ℓ/T, id) int64 keys. Gumbel-max sampling: https://arxiv.org/abs/1411.0030.
Stage 2 (kernels/streaming.py) reduces the [b, V/BLOCK_V] partials. A per-row vocabulary
limit (a nested pass over several heads, kernels/nested.py) scores a row's columns past its
own V as -inf; W is still read once per tile (all rows of a step share one b block up to 64).

With FROM_LOGITS the same epilogue reads materialized logits instead: the split path's sampler
on GPU, so both paths share one epilogue and draw identical noise.
Related work: FlashSampling, vLLM's flash_sampler_utils.py / gumbel.py (read, not copied).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from kernels import reference, rng
from kernels.errors import ShapeMismatch
from kernels.row_groups import bias_columns, reference_per_head, row_bias
from kernels.sampling_params import SampleOutput, SamplingBatch
from kernels.streaming import Partials, StreamSpec, finish, stream_spec

log = logging.getLogger(__name__)


@triton.jit
def _mix64(z):
    # splitmix64 finalizer on uint64 words (wrapping multiply, logical shifts).
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
    z = (z ^ (z >> 27)) * 0x94D049BB133111EB
    return z ^ (z >> 31)


@triton.jit
def _stage1(
    h_ptr, w_ptr, bias_ptr, temp_ptr, rowkey_ptr, vlim_ptr,
    best_val_ptr, best_idx_ptr, raw_m_ptr, raw_s_ptr, sc_m_ptr, sc_s_ptr, cand_ptr,
    b, V, d, stride_h, stride_w, stride_bias, n_tiles,
    BLOCK_B: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_D: tl.constexpr, K: tl.constexpr,
    FROM_LOGITS: tl.constexpr, DOT_FP32: tl.constexpr, HAS_BIAS: tl.constexpr,
    SAMPLE: tl.constexpr, LOGPROBS: tl.constexpr, TOP_P: tl.constexpr, TOP_K: tl.constexpr,
):
    pid_v = tl.program_id(0)
    pid_b = tl.program_id(1)
    rows = pid_b * BLOCK_B + tl.arange(0, BLOCK_B)  # [BB]
    cols = pid_v * BLOCK_V + tl.arange(0, BLOCK_V)  # [BV]
    rmask = rows < b
    cmask = cols < V
    # Each row's own V (a nested pass: its head is a prefix of W); columns past it are -inf.
    vlim = tl.load(vlim_ptr + rows, mask=rmask, other=0)
    vmask = cols[None, :] < vlim[:, None]  # [BB, BV]
    if FROM_LOGITS:
        acc = tl.load(w_ptr + rows[:, None] * stride_w + cols[None, :],
                      mask=rmask[:, None] & cmask[None, :], other=0.0)
    else:
        acc = tl.zeros((BLOCK_B, BLOCK_V), dtype=tl.float32)
        for k0 in range(0, d, BLOCK_D):
            ks = k0 + tl.arange(0, BLOCK_D)
            kmask = ks < d
            h = tl.load(h_ptr + rows[:, None] * stride_h + ks[None, :],
                        mask=rmask[:, None] & kmask[None, :], other=0.0)
            w = tl.load(w_ptr + cols[:, None] * stride_w + ks[None, :],
                        mask=cmask[:, None] & kmask[None, :], other=0.0)
            if DOT_FP32:
                # fp32 compute must match an fp32 matmul: no TF32 rounding of the inputs.
                acc = tl.dot(h.to(tl.float32), tl.trans(w.to(tl.float32)), acc,
                             input_precision="ieee")
            else:
                acc = tl.dot(h, tl.trans(w), acc)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + rows[:, None] * stride_bias + cols[None, :],
                       mask=rmask[:, None] & cmask[None, :], other=0.0)
    raw = tl.where(cmask[None, :] & vmask, acc, float("-inf"))  # [BB, BV]
    t = tl.load(temp_ptr + rows, mask=rmask, other=0.0)
    sampled = (t > 0)[:, None]
    t_safe = tl.where(t > 0, t, 1.0)
    scaled = tl.where(sampled, tl.math.div_rn(raw, t_safe[:, None]), raw)
    if SAMPLE:
        key = tl.load(rowkey_ptr + rows, mask=rmask, other=0).to(tl.uint64, bitcast=True)
        z = _mix64(key[:, None] + (cols[None, :].to(tl.uint64) + 1) * 0x9E3779B97F4A7C15)
        u = ((z >> 12).to(tl.float64) + 0.5) * 2.220446049250313e-16  # 52-bit uniform
        g = (-tl.log(-tl.log(u))).to(tl.float32)
        score = tl.where(sampled, scaled + g, raw)
    else:
        score = raw
    best, idx = tl.max(score, axis=1, return_indices=True, return_indices_tie_break_left=True)
    out = rows * n_tiles + pid_v
    tl.store(best_val_ptr + out, best, mask=rmask)
    tl.store(best_idx_ptr + out, (idx + pid_v * BLOCK_V).to(tl.int64), mask=rmask)
    if LOGPROBS:
        m = tl.max(raw, axis=1)
        m_safe = tl.where(m == float("-inf"), 0.0, m)
        tl.store(raw_m_ptr + out, m, mask=rmask)
        tl.store(raw_s_ptr + out, tl.sum(tl.exp(raw - m_safe[:, None]), axis=1), mask=rmask)
    if TOP_P:
        m = tl.max(scaled, axis=1)
        m_safe = tl.where(m == float("-inf"), 0.0, m)
        tl.store(sc_m_ptr + out, m, mask=rmask)
        tl.store(sc_s_ptr + out, tl.sum(tl.exp(scaled - m_safe[:, None]), axis=1), mask=rmask)
    if TOP_K:
        # Pack (ℓ/T, id) into an int64 ordered by value, ties to the lowest id.
        bits = scaled.to(tl.int32, bitcast=True)
        ordered = (bits ^ ((bits >> 31) & 0x7FFFFFFF)).to(tl.int64)
        keys = (ordered << 32) | (4294967295 - cols[None, :].to(tl.int64))
        # K rounds of max-extraction: keys are unique (ids are), so this is an exact top-K,
        # and far cheaper than tl.topk's full sort (which also crawls in the interpreter).
        base = cand_ptr + rows * n_tiles * K + pid_v * K
        for j in range(K):
            top = tl.max(keys, axis=1)  # [BB]
            tl.store(base + j, top, mask=rmask)
            keys = tl.where(keys == top[:, None], -9223372036854775808, keys)


@dataclass(frozen=True, slots=True)
class Blocks:
    block_v: int
    block_d: int
    num_warps: int
    num_stages: int


# GPU: 128-wide V tiles keep >1000 CTAs in flight at V=262k (enough to saturate HBM);
# the interpreter wants few, large programs instead.
GPU_BLOCKS = Blocks(block_v=128, block_d=64, num_warps=4, num_stages=4)
INTERPRETER_BLOCKS = Blocks(block_v=512, block_d=128, num_warps=4, num_stages=1)


def _dot_fp32(h: torch.Tensor, w: torch.Tensor) -> bool:
    # Triton 3.9's interpreter computes bf16 tl.dot wrongly (numpy has no bf16), so off-GPU
    # both tiles are upcast: bf16 products are exact in fp32, the result is the same math.
    return h.dtype != w.dtype or h.dtype == torch.float32 or not h.is_cuda


def _block_b(b: int) -> int:
    return 16 if b <= 16 else 32 if b <= 32 else 64


def _partials(
    src: torch.Tensor, hidden: torch.Tensor | None, batch: SamplingBatch, spec: StreamSpec,
    vocab: int, bias: torch.Tensor | None, blocks: Blocks, from_logits: bool,
    row_vocab: torch.Tensor | None = None,
) -> Partials:
    """`row_vocab`: [b] int64, each row's own V <= vocab (a nested pass); None: all vocab."""
    b, dev = len(batch), src.device
    block_v = max(blocks.block_v, spec.top_k)
    n = triton.cdiv(vocab, block_v)
    def f32() -> torch.Tensor:
        return torch.empty(b, n, dtype=torch.float32, device=dev)

    p = Partials(f32(), torch.empty(b, n, dtype=torch.int64, device=dev))
    dummy = p.best_val
    if spec.logprobs:
        p.raw_m, p.raw_s = f32(), f32()
    if spec.top_p:
        p.scaled_m, p.scaled_s = f32(), f32()
    if spec.top_k:
        p.cand_keys = torch.empty(b, n * spec.top_k, dtype=torch.int64, device=dev)
    temp = batch.temperature.to(dev, torch.float32).contiguous()
    keys = rng.row_keys(batch.seed, batch.position).to(dev).contiguous()
    vlim = (torch.full((b,), vocab, dtype=torch.int64, device=dev) if row_vocab is None
            else row_vocab.to(dev, torch.int64).contiguous())
    h = src if hidden is None else hidden
    bb = _block_b(b)
    grid = (n, triton.cdiv(b, bb))
    _stage1[grid](
        h, src, dummy if bias is None else bias, temp, keys, vlim,
        p.best_val, p.best_idx, p.raw_m if p.raw_m is not None else dummy,
        p.raw_s if p.raw_s is not None else dummy,
        p.scaled_m if p.scaled_m is not None else dummy,
        p.scaled_s if p.scaled_s is not None else dummy,
        p.cand_keys if p.cand_keys is not None else p.best_idx,
        b, vocab, src.shape[1], h.stride(0), src.stride(0),
        0 if bias is None else bias.stride(0), n,
        BLOCK_B=bb, BLOCK_V=block_v, BLOCK_D=blocks.block_d, K=max(spec.top_k, 1),
        FROM_LOGITS=from_logits, DOT_FP32=_dot_fp32(h, src), HAS_BIAS=bias is not None,
        SAMPLE=spec.sample, LOGPROBS=spec.logprobs, TOP_P=spec.top_p, TOP_K=spec.top_k > 0,
        num_warps=blocks.num_warps, num_stages=blocks.num_stages,
    )
    return p


def unembed_and_sample(
    hidden: torch.Tensor, weight: torch.Tensor, batch: SamplingBatch,
    bias: torch.Tensor | None = None, blocks: Blocks | None = None,
    row_vocab: torch.Tensor | None = None,
) -> SampleOutput:
    """Same call and result as kernels.reference.unembed_and_sample, in one pass over W.

    `row_vocab` [b] int64: a nested pass (kernels/nested.py). Row i samples among its own
    head's first row_vocab[i] rows of W, as if it ran alone against weight[:row_vocab[i]]."""
    if hidden.dim() != 2 or weight.dim() != 2 or hidden.shape[1] != weight.shape[1]:
        raise ShapeMismatch(f"hidden {tuple(hidden.shape)} vs weight {tuple(weight.shape)}")
    if len(batch) != hidden.shape[0]:
        raise ShapeMismatch(f"batch has {len(batch)} rows, hidden has {hidden.shape[0]}")
    vocab = weight.shape[0]
    blocks = blocks or (GPU_BLOCKS if hidden.is_cuda else INTERPRETER_BLOCKS)
    # bf16 × bf16 runs on tensor cores; any fp32 operand makes the whole dot fp32 (IEEE).
    compute = torch.bfloat16 if hidden.dtype == weight.dtype == torch.bfloat16 else torch.float32
    h = hidden.to(compute).contiguous()
    w = weight if weight.stride(1) == 1 else weight.contiguous()  # a row prefix stays a view
    bias2 = _bias(bias, hidden.shape[0], vocab, hidden.device)
    limits = vocab if row_vocab is None else row_vocab.to(hidden.device, torch.int64)
    spec = stream_spec(batch, limits)
    p = _partials(w, h, batch, spec, vocab, bias2, blocks, from_logits=False,
                  row_vocab=row_vocab)

    def logit_at(tokens: torch.Tensor) -> torch.Tensor:
        out = (hidden.to(torch.float32) * weight[tokens].to(torch.float32)).sum(dim=1)
        return out if bias2 is None else out + bias2.gather(1, tokens[:, None]).squeeze(1)

    def fallback(rows: torch.Tensor) -> SampleOutput:
        if row_vocab is not None:
            return reference_per_head(hidden, weight, batch, bias2, row_vocab, rows)
        return reference.unembed_and_sample(
            hidden[rows], weight, _rows(batch, rows), None if bias2 is None else bias2[rows])

    return finish(p, spec, batch, limits, logit_at, fallback)


def sample_logits(
    logits: torch.Tensor, batch: SamplingBatch, blocks: Blocks | None = None
) -> SampleOutput:
    """The split path's sampler: the fused epilogue over materialized logits [b, V] fp32."""
    b, vocab = logits.shape
    logits = logits.contiguous()
    blocks = blocks or (GPU_BLOCKS if logits.is_cuda else INTERPRETER_BLOCKS)
    spec = stream_spec(batch, vocab)
    p = _partials(logits, None, batch, spec, vocab, None, blocks, from_logits=True)

    def logit_at(tokens: torch.Tensor) -> torch.Tensor:
        return logits.gather(1, tokens[:, None]).squeeze(1)

    def fallback(rows: torch.Tensor) -> SampleOutput:
        return reference.sample_from_logits(logits[rows], _rows(batch, rows))

    return finish(p, spec, batch, vocab, logit_at, fallback)


def _bias(bias: torch.Tensor | None, b: int, vocab: int, dev: torch.device) -> torch.Tensor | None:
    # [V] or [b, Vb] -> [b, V] fp32: the kernel's epilogue reads a full-width bias row
    rows = row_bias(bias, b, vocab)
    return None if rows is None else bias_columns(rows.to(dev), vocab).contiguous()


def _rows(batch: SamplingBatch, rows: torch.Tensor) -> SamplingBatch:
    return SamplingBatch(
        batch.temperature[rows], batch.top_p[rows], batch.top_k[rows], batch.seed[rows],
        batch.position[rows], batch.want_logprobs,
    )
